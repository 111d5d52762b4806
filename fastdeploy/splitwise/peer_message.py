"""Reading what arrives on a PD connector socket: one parser for every frame a peer sends (SERVICES §7).

`open_message` checks a received multipart message — header size, encoding, JSON shape and types (a typed
msgspec Struct: no nesting is ever followed, so no depth can exhaust the stack), protocol version, known kind,
frame count and sizes, and the connector tag, compared as bytes — and returns either an `Opened` message or a
`Refused` one naming the reason (one of REFUSE_REASONS) and why. It never raises: whatever a peer sends becomes one
of the two. Who may send what, and which id is whose, is the transport's to check (zmq_transport.py).

Header frame (canonical JSON): `{"kind", "nonce", "request_id", "tag", "v"}`. `nonce` is the reservation's: D
draws a fresh one for every reservation, and P's acceptance (sent at once), its hand-off or refusal, and D's ack
for that reservation repeat it; the tag covers it, so a reservation cannot be replayed and a message cannot be
moved to another reservation of the same id (docs/design.md §8, "Hostile peers").
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import msgspec

from fastdeploy.splitwise.integrity import PROTOCOL_VERSION, canonical_json
from fastdeploy.splitwise.kv_stream import MAX_PIECE_FRAMES, PIECE_BYTES
from fastdeploy.splitwise.secret import MessageTagger

RESERVE, ACCEPT, ACK, HANDOFF, REFUSE = "reserve", "accept", "ack", "handoff", "refuse"
STREAM, KV, END = "stream", "kv", "end"   # a hand-off whose KV follows in pieces (kv_stream.py)
KINDS = (RESERVE, ACCEPT, ACK, HANDOFF, REFUSE, STREAM, KV, END)
_KV_BYTES_AFTER_FRAME_0 = (HANDOFF, STREAM, KV)   # kinds whose frames past the first are KV (the hand-off tag's)
REFUSE_REASONS = ("bad_tag", "duplicate", "full", "internal", "malformed", "oversized", "replayed", "stale",
                  "unexpected_kind", "unknown_kind", "version")
# Why P tells D it will not write a hand-off for a reservation it took (a `refuse` answer, SERVICES §7): the request
# ended on P before its hand-off started, the reservation expired without its request, or P dropped a duplicate
WILL_NOT_WRITE = ("abandoned", "expired", "duplicate")
MAX_REQUEST_ID = 512
MAX_HEADER_BYTES = 2048
MAX_RESERVATION_DATA = 1 << 20     # bytes of JSON a reservation may carry (block destinations of a long prompt)
MAX_REFUSAL_BYTES = 256
MAX_KV_FRAMES = 1 << 16
# Bytes of one frame a connector socket takes in at most (ZMQ_MAXMSGSIZE, per frame in libzmq; a bigger one drops
# the peer's connection before any of it is buffered): the largest legitimate frame for the instance's
# --max-model-len. That is a streamed piece (PIECE_BYTES), a reservation's data (MAX_RESERVATION_DATA) or a
# hand-off's header: its prompt ids (at most 16 JSON bytes a token) and bounded fields (64 KiB: logprobs, placed
# KV descriptors of every layer).
_HEADER_BYTES_PER_TOKEN = 16
_HEADER_FIXED_BYTES = 64 << 10


def max_frame_bytes(max_model_len: int) -> int:
    return max(PIECE_BYTES, MAX_RESERVATION_DATA, _HEADER_FIXED_BYTES + _HEADER_BYTES_PER_TOKEN * max_model_len) \
        + MAX_HEADER_BYTES
NONCE_HEX = 32                     # 16 random bytes
# Body frames each kind may carry: (at most, bytes per frame at most; None: unbounded, a hand-off's KV)
_BODY = {RESERVE: (1, MAX_RESERVATION_DATA), ACCEPT: (0, 0), ACK: (0, 0), REFUSE: (1, MAX_REFUSAL_BYTES),
         HANDOFF: (1 + MAX_KV_FRAMES, None), STREAM: (1, None), KV: (1 + MAX_PIECE_FRAMES, None),
         END: (1, 256)}
BAD_TAG = ("the connector's message tag did not verify (a wrong or missing shared secret on one side, or frames "
           "damaged on the way)")


class _Header(msgspec.Struct, forbid_unknown_fields=True):
    kind: Annotated[str, msgspec.Meta(max_length=32)]
    request_id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REQUEST_ID)]
    tag: Annotated[str, msgspec.Meta(max_length=128)]
    v: int
    nonce: Annotated[str, msgspec.Meta(max_length=NONCE_HEX)] = ""   # absent in a build before nonces


class _Version(msgspec.Struct):
    v: int


_decode_header = msgspec.json.Decoder(_Header).decode
_decode_version = msgspec.json.Decoder(_Version).decode


@dataclass(frozen=True, slots=True)
class Opened:
    """A message whose header parsed and whose tag verified."""

    kind: str
    request_id: str
    nonce: str
    body: list[memoryview]


@dataclass(frozen=True, slots=True)
class Refused:
    """A message refused: `reason` (REFUSE_REASONS) and what to log. `request_id`, `kind` and `nonce` are the
    header's when it parsed (never verified unless the reason is past the tag check), else None / ""."""

    reason: str
    why: str
    request_id: str | None = None
    kind: str | None = None
    nonce: str = ""


def version_error(peer: str, version: object) -> str:
    """The refusal of a peer on another protocol version, naming both versions."""
    return (f"{peer} speaks PD connector protocol version {version!r}; this build speaks version {PROTOCOL_VERSION} "
            "(upgrade P and D together)")


def header_frame(tagger: MessageTagger, kind: str, request_id: str, nonce: str, frames: Sequence) -> bytes:
    """The header frame of a message with body `frames`, tagged."""
    fields = {"kind": kind, "nonce": nonce, "request_id": request_id, "v": PROTOCOL_VERSION}
    return canonical_json({**fields, "tag": tagger.tag(*_tagged(fields, frames))})


def open_message(parts: Sequence, sender: str, tagger: MessageTagger) -> Opened | Refused:
    """Check one received message (frames, identity removed) from `sender`; never raises."""
    try:
        return _open(parts, sender, tagger)
    except Exception as error:   # noqa: BLE001 - a parser bug must refuse one message, never stop the instance
        return Refused("internal", f"a message from {sender} that could not be read ({type(error).__name__}: "
                                   f"{error})")


def _open(parts: Sequence, sender: str, tagger: MessageTagger) -> Opened | Refused:
    if not parts:
        return Refused("malformed", f"an empty message from {sender}")
    raw = memoryview(parts[0].buffer if hasattr(parts[0], "buffer") else parts[0]).cast("B")
    if raw.nbytes > MAX_HEADER_BYTES:
        return Refused("oversized", f"a {raw.nbytes}-byte header from {sender} (at most {MAX_HEADER_BYTES})")
    try:
        header = _decode_header(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        return _unreadable(raw, sender, error)
    kind, rid, nonce = header.kind, header.request_id, header.nonce
    if header.v != PROTOCOL_VERSION:
        return Refused("version", version_error(sender, header.v), rid, kind, nonce)
    if kind not in KINDS:
        return Refused("unknown_kind", f"kind {kind!r:.40} from {sender}", rid)
    body = [memoryview(part.buffer if hasattr(part, "buffer") else part).cast("B") for part in parts[1:]]
    most, frame_bytes = _BODY[kind]
    if len(body) > most or (frame_bytes is not None and any(f.nbytes > frame_bytes for f in body)):
        return Refused("oversized", f"a {kind} from {sender} with {len(body)} body frames of "
                                    f"{[f.nbytes for f in body[:4]]} bytes", rid, kind, nonce)
    fields = {"kind": kind, "nonce": nonce, "request_id": rid, "v": header.v}
    if not tagger.verify(header.tag, *_tagged(fields, body)):
        return Refused("bad_tag", f"a {kind} from {sender} whose tag does not verify (wrong or missing shared "
                                  "secret, or a damaged header or body frame)", rid, kind, nonce)
    if kind != REFUSE and (len(nonce) != NONCE_HEX or not _is_hex(nonce)):
        return Refused("malformed", f"a {kind} from {sender} without a nonce of {NONCE_HEX} hex digits (a build "
                                    "before nonces: upgrade P and D together)", rid, kind)
    return Opened(kind, rid, nonce, body)


def _unreadable(raw: memoryview, sender: str, error: Exception) -> Refused:
    """A header that is not ours: refused as another version when it names one, else as malformed."""
    try:
        version = _decode_version(raw).v
    except (msgspec.DecodeError, RecursionError):   # skipping a deeply nested unknown field recurses
        version = PROTOCOL_VERSION
    if version != PROTOCOL_VERSION:
        return Refused("version", version_error(sender, version))
    return Refused("malformed", f"a header from {sender} that is not {{kind, nonce, request_id, tag, v}} JSON "
                                f"({str(error)[:120]})")


def decode_data(frame: memoryview) -> dict | None:
    """A reservation's data frame as a JSON object (bounded size; nesting bounded by msgspec's decoder, which
    raises RecursionError past its depth); None when it is not one."""
    if frame.nbytes > MAX_RESERVATION_DATA:
        return None
    try:
        data = msgspec.json.decode(frame)
    except (msgspec.DecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def encode_data(request_id: str, data: object) -> bytes:
    if not isinstance(data, dict):
        raise ValueError(f"ZmqTransport.reserve: request {request_id}: argument 'data' must be a dict "
                         f"(got {type(data).__name__})")
    encoded = canonical_json(data)
    if len(encoded) > MAX_RESERVATION_DATA:
        raise ValueError(f"ZmqTransport.reserve: request {request_id}: argument 'data' is {len(encoded)} bytes of "
                         f"JSON, at most {MAX_RESERVATION_DATA}")
    return encoded


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _tagged(fields: dict, frames: Sequence) -> tuple[bytes, Sequence]:
    """What the message tag covers: the header fields with the frame count, and every body frame except KV bytes
    (a hand-off's KV frames, a streamed piece's bytes: the hand-off's own tag covers those)."""
    kv_after_first = fields["kind"] in _KV_BYTES_AFTER_FRAME_0
    return canonical_json({**fields, "frames": len(frames)}), frames[:1] if kv_after_first else frames
