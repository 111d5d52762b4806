"""The listening socket the API server and the router bind before they say they are ready."""
from __future__ import annotations

import socket


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
