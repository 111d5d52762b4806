"""Hand-made connector frames for the tests that play a rogue or outdated peer (SERVICES §7)."""
from __future__ import annotations

import json

from fastdeploy.splitwise.integrity import PROTOCOL_VERSION, canonical_json
from fastdeploy.splitwise.peer_message import header_frame
from fastdeploy.splitwise.secret import MessageTagger


def header(kind: str, request_id: str, nonce: str, frames=(), secret: bytes | None = None) -> bytes:
    """A correctly tagged header frame for a message with body `frames` (keyed when `secret` is given)."""
    return header_frame(MessageTagger(secret), kind, request_id, nonce, list(frames))


def nonce_of(frame) -> str:
    """The nonce in a received header frame."""
    return json.loads(bytes(frame))["nonce"]


def raw_header(**fields) -> bytes:
    """A header frame with exactly `fields` (no tag computed unless given): for malformed headers."""
    return canonical_json({"v": PROTOCOL_VERSION, **fields})
