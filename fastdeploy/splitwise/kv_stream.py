"""A hand-off's KV in pieces over the connector: P hashes piece i while piece i-1 is on the wire, D verifies and
writes each piece into the request's blocks as it arrives (SERVICES §7 "Streamed hand-off", docs/design.md §8).

A streamed hand-off is three kinds of connector message, in order, each its own ZeroMQ message (a multipart
message is delivered whole, so pieces must be separate messages for D to start before the last byte left P):

- `stream`: body = the hand-off's frame 0 *without its tag*: `PREFIX | canonical header` of a placed hand-off
  (`kv.inline` false: the KV is not in this message, it lands in D's blocks), exactly the bytes the tag hashes first;
- `kv` (one per piece, about PIECE_BYTES each): body = the piece's index (u64 little-endian), then its KV bytes in
  1..MAX_PIECE_FRAMES frames (each a run of P's blocks, which the transport copies into a message of its own as it
  hands the piece over; runs shorter than ZERO_COPY_MIN_BYTES are joined into one frame when cut), the next bytes
  of positions kv_start..L-1 of every layer in the tag's order (kv_start = 0 unless D's prefix cache held the
  prompt's first blocks, PD_MTP_FLOW §13.6);
- `end`: body = canonical JSON `{"pieces": n, "tag": t}`, t being the hand-off tag over the header, the reused
  blocks' keys and every KV byte (integrity.py), sent once the last piece left.

D then holds a placed hand-off whose tag it has already compared over the bytes as they were written into its blocks
(`Incoming.finish`), and the receipt skips recomputing it (receipt.py `kv_landed`).
"""
from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from fastdeploy.splitwise.handoff import HandoffMessage, kv_start_error
from fastdeploy.splitwise.integrity import (PROTOCOL_VERSION, HandoffKey, TagHasher, byte_view, canonical_json,
                                            tags_equal)
from fastdeploy.splitwise.wire import KV_DTYPES, MAGIC, PREFIX, HandoffDecodeError, read_prefix

PIECE_BYTES = 1 << 20        # about a layer of a 1k-token prompt; small enough that the next one hashes meanwhile
MAX_PIECE_FRAMES = 64        # frames of one piece: scattered blocks travel as one message, not one each
# Below this a frame costs more to send by itself (~30 µs of pyzmq per frame) than to copy: a piece of smaller runs
# of blocks is copied into one frame instead (measured: 16 frames of 64 KiB 0.45 ms slower than one of 1 MiB)
ZERO_COPY_MIN_BYTES = 256 << 10
SEQ = struct.Struct("<Q")
MAX_TRAILER_BYTES = 256


class StreamError(ValueError):
    """A streamed hand-off D cannot take: the text names why (the request fails with it); `reason` is the
    connector refusal it counts as (peer_message.REFUSE_REASONS), None for a tag that does not verify (the
    receipt counts that one, PD_MTP_FLOW §5.2 step 1)."""

    def __init__(self, why: str, reason: str | None = "malformed"):
        super().__init__(why)
        self.reason = reason


class _Trailer(msgspec.Struct, forbid_unknown_fields=True):
    pieces: int
    tag: str


class _Spec(msgspec.Struct):
    dtype: str
    shape: list[int]


class _KV(msgspec.Struct):
    target: list[_Spec]
    mtp: list[_Spec]


class _StreamHeader(msgspec.Struct):   # the fields D's I/O thread reads; the receipt checks the rest
    kv: _KV
    kv_start: int = 0


_decode_trailer = msgspec.json.Decoder(_Trailer).decode
_decode_kv = msgspec.json.Decoder(_StreamHeader).decode


def _described(header: bytes) -> tuple[int, int]:
    """The KV bytes a hand-off header's descriptors add up to, and its `kv_start`; StreamError when they cannot be
    read."""
    try:
        decoded = _decode_kv(header)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        # msgspec's message names the field (`$.kv_start`, `$.kv.target[0].shape` ...)
        raise StreamError(f"the stream's header is unreadable: {str(error)[:120]}") from None
    kv, total = decoded.kv, 0
    for spec in kv.target + kv.mtp:
        if spec.dtype not in KV_DTYPES or any(d < 0 for d in spec.shape):
            raise StreamError(f"the stream's header describes a KV array {spec.dtype!r:.20} {spec.shape[:4]}")
        total += math.prod(spec.shape) * KV_DTYPES[spec.dtype].itemsize
    return total, decoded.kv_start


@dataclass(slots=True)
class OutgoingStream:
    """P: one hand-off going out in pieces. `chunks` are the KV bytes in the tag's order (views of P's blocks, or
    of a buffer the stream owns); a piece is up to `piece_bytes` of them as views (the transport copies each into
    its own message as it sends the piece, so the blocks are read no more once the stream ended), hashed when cut,
    so the next piece is hashed while this one moves."""

    header: bytes                # PREFIX | canonical header without the tag
    chunks: Sequence[memoryview]
    hasher: TagHasher
    kv_nbytes: int
    piece_bytes: int = PIECE_BYTES
    _chunk: int = 0
    _offset: int = 0
    num_pieces: int = 0

    @classmethod
    def of(cls, message: HandoffMessage, chunks: Sequence, key: HandoffKey, reused: bytes = b"") -> OutgoingStream:
        """The stream of `message` (a placed hand-off, unsealed) with its KV read from `chunks`; `reused`: the keys
        of the blocks D reused (positions before the message's `kv_start`), under the tag."""
        canon = message.canonical_header()
        views = [byte_view(c) for c in chunks]
        total = sum(v.nbytes for v in views)
        if total != message.kv_nbytes:
            raise ValueError(f"OutgoingStream: request {message.request_id}: {total} KV bytes for descriptors of "
                             f"{message.kv_nbytes}")
        return cls(PREFIX.pack(MAGIC, PROTOCOL_VERSION, len(canon)) + canon, [v for v in views if v.nbytes],
                   key.hasher(canon, PIECE_BYTES, reused), total)

    def next_piece(self) -> list[memoryview | bytes] | None:
        """The next piece's frames, hashed, None when every KV byte has been cut: views of the chunks (at most
        MAX_PIECE_FRAMES, `piece_bytes` in all), or one copy of them (bytes) when they are many and small."""
        if self.hasher.num_bytes >= self.kv_nbytes:
            return None
        frames, size = [], 0
        while self._chunk < len(self.chunks) and size < self.piece_bytes and len(frames) < MAX_PIECE_FRAMES:
            view = self.chunks[self._chunk]
            take = min(view.nbytes - self._offset, self.piece_bytes - size)
            frames.append(view[self._offset:self._offset + take])
            size += take
            self._offset += take
            if self._offset == view.nbytes:
                self._chunk, self._offset = self._chunk + 1, 0
        self.hasher.update_all(frames)
        self.num_pieces += 1
        if len(frames) > 1 and size < ZERO_COPY_MIN_BYTES * len(frames):
            return [b"".join(frames)]
        return frames

    def trailer(self) -> bytes:
        return canonical_json({"pieces": self.num_pieces, "tag": self.hasher.hexdigest()})


@dataclass(slots=True)
class Landing:
    """D: where a request's streamed KV goes — writable views of its blocks in the tag's order (positions
    kv_start..L-1 of every layer), `nbytes` in all; nothing is written outside them. `reused`: the keys of the
    blocks D's prefix cache gave the request instead (positions 0..kv_start-1), which the tag covers."""

    views: Sequence[memoryview]
    reused: bytes = b""
    kv_start: int = 0
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.views = [byte_view(v) for v in self.views]
        if any(v.readonly for v in self.views):
            raise ValueError("Landing: argument 'views' must be writable")
        self.nbytes = sum(v.nbytes for v in self.views)


@dataclass(slots=True)
class Incoming:
    """D: one streamed hand-off being received into its landing. A stream whose header describes other than the
    bytes D reserved (P was given another prompt) is received without writing anything (`landing` None): its tag is
    still checked, so the receipt can name the mismatch (PD_MTP_FLOW §5.2 step 1b), and it is never inserted. One
    whose KV starts elsewhere than D's reservation said (`start_error`) is received the same way and fails at its
    trailer, naming the start."""

    header: bytes                # canonical header without the tag (what the tag hashes first)
    landing: Landing | None
    hasher: TagHasher
    expected: int                # KV bytes the stream must carry
    start_error: str | None = None
    num_pieces: int = 0
    written: int = 0             # KV bytes written into the landing
    _view: int = 0
    _offset: int = 0

    @classmethod
    def start(cls, frame: memoryview, landing: Landing, key: HandoffKey) -> Incoming:
        """From the `stream` message's body frame; StreamError naming what is wrong."""
        try:
            header_len = read_prefix(frame)
        except HandoffDecodeError as error:
            raise StreamError(str(error)) from None
        if frame.nbytes != PREFIX.size + header_len:
            raise StreamError(f"the stream's header frame is {frame.nbytes} bytes, its prefix says "
                              f"{PREFIX.size + header_len}")
        header = bytes(frame[PREFIX.size:])
        described, kv_start = _described(header)
        start_error = None if kv_start == landing.kv_start else kv_start_error(kv_start, landing.kv_start)
        fits = described == landing.nbytes and start_error is None
        return cls(header, landing if fits else None, key.hasher(header, PIECE_BYTES, landing.reused), described,
                   start_error)

    @property
    def received(self) -> int:
        return self.hasher.num_bytes

    def write(self, seq_frame: memoryview, frames: Sequence[memoryview]) -> None:
        """One `kv` piece (its index, then its frames): checked (the index, the size against what D reserved),
        hashed, written in place."""
        if seq_frame.nbytes != SEQ.size or SEQ.unpack(seq_frame)[0] != self.num_pieces:
            raise StreamError(f"piece {self.num_pieces} expected, got "
                              f"{SEQ.unpack(seq_frame)[0] if seq_frame.nbytes == SEQ.size else 'no index'}")
        if not frames or len(frames) > MAX_PIECE_FRAMES:
            raise StreamError(f"a piece of {len(frames)} KV frames (1 to {MAX_PIECE_FRAMES})")
        if self.received + sum(f.nbytes for f in frames) > self.expected:
            raise StreamError(f"the pieces exceed the {self.expected} KV bytes the stream's header describes",
                              "oversized")
        self.hasher.update_all(frames)
        self.num_pieces += 1
        if self.landing is not None:
            for frame in frames:
                self._land(np.frombuffer(frame, np.uint8))

    def _land(self, source: np.ndarray) -> None:
        done = 0
        while done < source.nbytes:
            view = self.landing.views[self._view]
            take = min(view.nbytes - self._offset, source.nbytes - done)
            np.frombuffer(view, np.uint8, take, self._offset)[:] = source[done:done + take]
            done += take
            self._offset += take
            if self._offset == view.nbytes:
                self._view, self._offset = self._view + 1, 0
        self.written += source.nbytes

    def finish(self, body: memoryview) -> bytes:
        """The `end` message: every byte D reserved arrived and the tag verifies; returns the hand-off's tagged
        frame 0 (a placed hand-off, HandoffMessage.decode reads it). StreamError otherwise."""
        if body.nbytes > MAX_TRAILER_BYTES:
            raise StreamError(f"a {body.nbytes}-byte trailer (at most {MAX_TRAILER_BYTES})", "oversized")
        try:
            trailer = _decode_trailer(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            raise StreamError(f"the trailer is not {{pieces, tag}} JSON ({str(error)[:80]})") from None
        if trailer.pieces != self.num_pieces or self.received != self.expected:
            raise StreamError(f"the stream ended after {self.num_pieces} pieces and {self.received} KV bytes; the "
                              f"trailer says {trailer.pieces} pieces and its header {self.expected} bytes")
        if self.start_error is not None:
            raise StreamError(self.start_error, None)
        expected = self.hasher.hexdigest()
        if not tags_equal(trailer.tag, expected):
            raise StreamError(f"integrity tag {trailer.tag!r:.48} does not match the content's {expected!r}", None)
        tagged = self.header[:-1] + b',"tag":' + canonical_json(trailer.tag) + b"}"
        return PREFIX.pack(MAGIC, PROTOCOL_VERSION, len(tagged)) + tagged
