"""A stranger at a connector port, speaking ZMTP 3.0 by hand over a plain TCP socket: it completes the
NULL handshake (greeting, then READY naming its socket type) and sends frames of one multipart message that never
ends (each frame with the more-flag set), so that whatever the receiver takes in stays in its memory until the
connection closes. No libzmq on this side: the sender buffers nothing, so the receiver's memory is all that grows.
"""
from __future__ import annotations

import socket
import struct

FRAME_BYTES = 512 << 10
_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + bytes(31)
_MORE_LONG = b"\x03"   # flags: more frames follow, 8-byte size


def _ready(socket_type: bytes) -> bytes:
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    return bytes([0x04, len(body)]) + body   # a short command frame


def flood(connection: socket.socket, socket_type: bytes, total_bytes: int) -> int:
    """Handshake as `socket_type`, then send frames of one unfinished message until `total_bytes` went out or the
    peer dropped the connection. Returns the bytes of frames the kernel took (not what the peer kept)."""
    frame = _MORE_LONG + struct.pack(">Q", FRAME_BYTES) + bytes(FRAME_BYTES)
    sent = 0
    try:
        connection.sendall(_GREETING + _ready(socket_type))
        while sent < total_bytes:
            connection.sendall(frame)
            sent += FRAME_BYTES
    except OSError:   # the receiver dropped the connection (a failed handshake)
        pass
    return sent


def open_to(address: str) -> socket.socket:
    """A stranger D's TCP connection to P's port (the caller closes it)."""
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=30)


class FakeP:
    """A stranger P a client names in `prefill_addr`: it listens, and floods the first D that connects, keeping
    that connection open until `close`."""

    def __init__(self):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(30)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._connection: socket.socket | None = None

    def flood_first_d(self, total_bytes: int) -> int:
        self._connection, _ = self._listener.accept()
        self._connection.settimeout(30)
        return flood(self._connection, b"ROUTER", total_bytes)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._listener.close()
