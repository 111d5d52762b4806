"""The listening socket the API server and the router bind before they say they are ready, and how long they keep
an idle client connection open."""
from __future__ import annotations

import socket

# Seconds an idle keep-alive connection stays open (--timeout-keep-alive; uvicorn's own default is 5). A client pool
# that reuses a connection just as the server closes it gets a reset or an EOF instead of a response. Pools keep an
# idle connection for 5 s (httpx, so the OpenAI SDK), 15 s (aiohttp), 4 s (Node's undici) or 90 s (Go's net/http,
# Rust's reqwest, which sglang-router's client is built on): with the server's timeout above all of them the client
# is the side that closes idle connections.
DEFAULT_KEEP_ALIVE_S = 120.0


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not yet listening); OSError when the address is in use or not local."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
