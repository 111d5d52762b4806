"""A fake P for the connected-but-silent cases (SERVICES §6): a ROUTER socket that completes the connector's
handshake (with a PD secret: a CURVE server holding it, so it passes D's authentication) and then answers nothing,
unless a test tells it to acknowledge the next reservation."""
from __future__ import annotations

import json

import zmq

from fastdeploy.splitwise.peer_message import ACCEPT, RESERVE, header_frame
from fastdeploy.splitwise.secret import MessageTagger
from tests.splitwise.rogue import holding_secret

HANG_BOUND_MS = 60_000   # turns a hang into a failure; never an assertion on time


class SilentP:
    def __init__(self, secret: bytes | None = None):
        self._context = zmq.Context()
        self._tagger = MessageTagger(secret)
        self.socket = holding_secret(self._context.socket(zmq.ROUTER), secret, server=True)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.address = f"127.0.0.1:{self.socket.bind_to_random_port('tcp://127.0.0.1')}"

    def accept_next(self) -> str:
        """Read up to the next reservation and acknowledge it, as a live P does; returns its request id."""
        while True:
            assert self.socket.poll(HANG_BOUND_MS), "no reservation reached the fake P"
            identity, head, *_ = self.socket.recv_multipart()
            fields = json.loads(head)
            if fields.get("kind") == RESERVE:
                rid, nonce = fields["request_id"], fields["nonce"]
                self.socket.send_multipart([identity, header_frame(self._tagger, ACCEPT, rid, nonce, [])])
                return rid

    def close(self) -> None:
        self.socket.close()
        self._context.term()
