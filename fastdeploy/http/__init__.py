"""HTTP pieces the API server and the router share: the request-body parser and its limits (json_body.py) and
the listening socket (sockets.py)."""
