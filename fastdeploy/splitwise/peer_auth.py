"""Who may deliver frames to a connector socket: CurveZMQ keys derived from the PD secret (SERVICES §7).

libzmq keeps every frame of a multipart message until its last one arrives, and `ZMQ_MAXMSGSIZE` bounds a frame,
not a message, so the message tag (secret.py), checked once a message is whole, cannot stop a stranger from
filling memory with one unfinished message. Authentication must come before any frame is taken in, so it lives in
the ZMTP handshake: with a secret, P's ROUTER is a CURVE server and every D's DEALER a CURVE client, both keypairs
derived from the secret (BLAKE3 derive-key mode, one context each). A peer that does not hold the secret cannot
complete the handshake (a D must know the server's public key to say HELLO, and P's ZAP handler admits only the
client public key of the same secret; a P must hold the server's secret key to answer), and libzmq takes no
message from a connection before its handshake is done. CURVE also encrypts every frame, which is what the
hand-off pays for it (docs/benchmarks.md, "Connector authentication").

Without a secret the sockets speak ZMTP's NULL mechanism, as before: whoever reaches a connector port may deliver
frames (SERVICES §7 says what that costs).
"""
from __future__ import annotations

from dataclasses import dataclass

import zmq
from zmq.auth.thread import ThreadAuthenticator

from fastdeploy.splitwise.integrity import derive_key

SERVER_KEY_CONTEXT = "fastdeploy-pd 2026-12-06 connector curve server key"
CLIENT_KEY_CONTEXT = "fastdeploy-pd 2026-12-06 connector curve client key"


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """The two keypairs of one PD secret, Z85-encoded as libzmq's socket options take them."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def from_secret(cls, secret: bytes) -> CurveKeys:
        """The same secret always gives the same keys, so P and D need nothing but the secret to pair."""
        if not zmq.has("curve"):
            raise RuntimeError("PD connector: a PD secret needs libzmq with CURVE support (zmq.has('curve') is "
                               "False), which the pyzmq wheels bundle")
        server_secret = zmq.utils.z85.encode(derive_key(secret, SERVER_KEY_CONTEXT))
        client_secret = zmq.utils.z85.encode(derive_key(secret, CLIENT_KEY_CONTEXT))
        return cls(zmq.curve_public(server_secret), server_secret, zmq.curve_public(client_secret), client_secret)

    def make_server(self, socket: zmq.Socket) -> None:
        """P's ROUTER: set before it binds."""
        socket.curve_server = True
        socket.curve_secretkey = self.server_secret
        socket.curve_publickey = self.server_public

    def make_client(self, socket: zmq.Socket) -> None:
        """A D's DEALER: set before it connects; it then talks only to a server holding this secret."""
        socket.curve_serverkey = self.server_public
        socket.curve_publickey = self.client_public
        socket.curve_secretkey = self.client_secret


class _OnlyOurClient:
    """A ZAP credentials provider (pyzmq's interface) admitting one client public key."""

    def __init__(self, client_public: bytes):
        self._client_public = client_public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self._client_public


class PeerAuthenticator:
    """The ZAP handler of one context (pyzmq's ThreadAuthenticator, its own thread): admits a CURVE client only if
    its public key is the one derived from the PD secret. Started before the server socket binds."""

    def __init__(self, context: zmq.Context, keys: CurveKeys):
        self._auth = ThreadAuthenticator(context)
        self._auth.start()
        self._auth.configure_curve_callback("*", _OnlyOurClient(keys.client_public))

    def stop(self) -> None:
        self._auth.stop()
