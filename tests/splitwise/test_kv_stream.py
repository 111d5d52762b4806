"""The streamed hand-off (SERVICES §7, kv_stream.py): D writes and hashes each piece as it arrives and decides at the
trailer; pieces that are not D's to take are refused one by one; the transport's I/O thread ends with close. A P
driven by hand (a raw ROUTER speaking the connector's messages) lets a test stop the stream anywhere."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import zmq

from fastdeploy.splitwise import Deadline, HandoffMessage, HandoffSamplingParams, KVSpec, MonotonicClock, PlacedKV
from fastdeploy.splitwise.kv_stream import SEQ, Landing, OutgoingStream
from fastdeploy.splitwise.peer_message import END, KV, STREAM, header_frame
from fastdeploy.splitwise.receipt import Insert, receive_handoff
from fastdeploy.splitwise.secret import MessageTagger
from fastdeploy.splitwise.wire import PREFIX
from fastdeploy.splitwise.zmq_transport import ZmqTransport
from .fakes import reservation_ids
from .rogue import holding_secret

CLOCK = MonotonicClock()
WAIT_S = 10.0
SECRET = b"stream-secret"
TOKENS, ROW = 8, 64            # 8 positions of 64 float32 per layer, 2 layers: 4 KiB of KV
CONFIG = "cfg"


def _message(rid: str, key) -> HandoffMessage:
    spec = KVSpec("<f4", (TOKENS, ROW))
    return HandoffMessage.create_streamed(request_id=rid, prompt_token_ids=list(range(TOKENS)),
                                          sampling=HandoffSamplingParams(max_tokens=4), t0=3, draft_token_ids=[3],
                                          placed_kv=PlacedKV((spec, spec), ()), config_hash=CONFIG, key=key)


class HandDrivenP:
    """P's side of the connector as raw frames: takes a reservation, sends any connector message for it."""

    def __init__(self, secret: bytes | None):
        self.tagger = MessageTagger(secret)
        self.socket = holding_secret(zmq.Context.instance().socket(zmq.ROUTER), secret, server=True)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.address = f"127.0.0.1:{self.socket.bind_to_random_port('tcp://127.0.0.1')}"

    def take_reservation(self) -> tuple[bytes, str, str]:
        assert self.socket.poll(int(WAIT_S * 1000)), "no reservation came"
        identity, header, *_ = self.socket.recv_multipart()
        fields = json.loads(header)
        return identity, fields["request_id"], fields["nonce"]

    def send(self, identity: bytes, kind: str, rid: str, nonce: str, frames: list) -> None:
        self.socket.send_multipart([identity, header_frame(self.tagger, kind, rid, nonce, frames), *frames])

    def close(self) -> None:
        self.socket.close()


@pytest.fixture
def pair():
    made = []

    def make(secret: bytes | None = SECRET):
        p, d = HandDrivenP(secret), ZmqTransport(secret=secret)
        made.append((p, d))
        return p, d

    yield make
    for p, d in made:
        d.close()
        p.close()


def _wait_until(predicate) -> None:
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if predicate():
            return
        done.wait(0.01)
    raise AssertionError("the condition was not reached in time")


def _reserve(d: ZmqTransport, p: HandDrivenP, rid: str, nbytes: int) -> tuple[np.ndarray, bytes, str]:
    blocks = np.zeros(nbytes, np.uint8)
    d.expect_kv(rid, Landing([memoryview(blocks)]))
    d.reserve(rid, p.address)
    identity, got, nonce = p.take_reservation()
    assert got == rid
    return blocks, identity, nonce


def test_pieces_are_written_into_d_blocks_as_they_arrive_and_verified_at_the_trailer(pair):
    p, d = pair()
    message = _message("r0", d.handoff_key)
    kv = np.random.default_rng(0).standard_normal(2 * TOKENS * ROW, dtype=np.float32)
    stream = OutgoingStream.of(message, [kv], d.handoff_key)
    stream.piece_bytes = 1024
    blocks, identity, nonce = _reserve(d, p, "r0", kv.nbytes)
    p.send(identity, STREAM, "r0", nonce, [stream.header])
    written = 0
    while (piece := stream.next_piece()) is not None:
        p.send(identity, KV, "r0", nonce, [SEQ.pack(stream.num_pieces - 1), *piece])
        written += sum(frame.nbytes for frame in piece)
        # D writes each piece before the next one left P, and delivers nothing before the trailer
        _wait_until(lambda: np.array_equal(blocks[:written], kv.view(np.uint8)[:written]))
        assert d.poll() is None and not blocks[written:].any()
    p.send(identity, END, "r0", nonce, [stream.trailer()])
    envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
    assert envelope.error is None and envelope.kv_landed == kv.nbytes and stream.num_pieces == 4
    verdict = receive_handoff("r0", envelope.payload, config_hash=CONFIG, num_speculative_tokens=0,
                              key=d.handoff_key, kv_landed=envelope.kv_landed)
    assert isinstance(verdict, Insert) and verdict.message.tag == stream.hasher.hexdigest()


@pytest.mark.parametrize("secret", [None, SECRET], ids=["unkeyed", "keyed"])
def test_a_flipped_byte_in_one_piece_fails_the_request_at_the_trailer(pair, secret):
    p, d = pair(secret)
    kv = np.arange(2 * TOKENS * ROW, dtype=np.float32)
    stream = OutgoingStream.of(_message("r0", d.handoff_key), [kv], d.handoff_key)
    stream.piece_bytes = 1024
    blocks, identity, nonce = _reserve(d, p, "r0", kv.nbytes)
    p.send(identity, STREAM, "r0", nonce, [stream.header])
    while (piece := stream.next_piece()) is not None:
        if stream.num_pieces == 2:
            np.frombuffer(piece[0], np.uint8)[7] ^= 0x10          # damaged after P hashed it
        p.send(identity, KV, "r0", nonce, [SEQ.pack(stream.num_pieces - 1), *piece])
    p.send(identity, END, "r0", nonce, [stream.trailer()])
    envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
    assert envelope.request_id == "r0" and envelope.kv_landed is None
    assert "integrity tag" in envelope.error and "does not match" in envelope.error
    assert d.num_refused() == 0, "a wrong tag is the receipt's to count (PD_MTP_FLOW §5.2 step 1)"


def test_pieces_d_did_not_reserve_or_beyond_the_reserved_size_are_refused(pair):
    p, d = pair()
    kv = np.arange(2 * TOKENS * ROW, dtype=np.float32)
    stream = OutgoingStream.of(_message("r0", d.handoff_key), [kv], d.handoff_key)
    blocks, identity, nonce = _reserve(d, p, "r0", kv.nbytes)
    p.send(identity, KV, "r-unknown", nonce, [SEQ.pack(0), b"x" * 64])        # no stream of D's for that id
    p.send(identity, KV, "r0", nonce, [SEQ.pack(0), b"x" * 64])               # before its stream began
    _wait_until(lambda: d.num_refused("stale") == 2)
    p.send(identity, STREAM, "r0", nonce, [stream.header])
    p.send(identity, KV, "r0", nonce, [SEQ.pack(0), np.ones(kv.nbytes + 1, np.uint8)])   # more than D reserved
    envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
    assert "exceed" in envelope.error and d.num_refused("oversized") == 1
    assert not blocks.any(), "nothing of a refused piece is written"
    p.send(identity, KV, "r0", nonce, [SEQ.pack(1), b"y" * 64])               # the stream is over: stale
    _wait_until(lambda: d.num_refused("stale") == 3)
    assert d.poll() is None and not blocks.any()


def test_an_out_of_order_piece_and_a_short_stream_fail_their_requests(pair):
    p, d = pair()
    kv = np.arange(2 * TOKENS * ROW, dtype=np.float32)
    for rid, bad in (("r-order", "order"), ("r-short", "short")):
        stream = OutgoingStream.of(_message(rid, d.handoff_key), [kv], d.handoff_key)
        stream.piece_bytes = 1024
        _, identity, nonce = _reserve(d, p, rid, kv.nbytes)
        p.send(identity, STREAM, rid, nonce, [stream.header])
        piece = stream.next_piece()
        p.send(identity, KV, rid, nonce, [SEQ.pack(1 if bad == "order" else 0), *piece])
        if bad == "short":
            p.send(identity, END, rid, nonce, [stream.trailer()])
        envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
        assert envelope.request_id == rid and envelope.kv_landed is None
        assert ("piece 0 expected" if bad == "order" else "the stream ended after 1 pieces") in envelope.error
    assert d.num_refused("malformed") == 2


def test_a_stream_whose_request_ended_writes_nothing_more(pair):
    """D's request ends mid-stream: once release_kv returns no piece is written into its blocks."""
    p, d = pair()
    kv = np.arange(2 * TOKENS * ROW, dtype=np.float32)
    stream = OutgoingStream.of(_message("r0", d.handoff_key), [kv], d.handoff_key)
    stream.piece_bytes = 1024
    blocks, identity, nonce = _reserve(d, p, "r0", kv.nbytes)
    p.send(identity, STREAM, "r0", nonce, [stream.header])
    p.send(identity, KV, "r0", nonce, [SEQ.pack(0), *stream.next_piece()])
    _wait_until(lambda: blocks[:1024].any())
    d.release_kv("r0")
    after = blocks.copy()
    p.send(identity, KV, "r0", nonce, [SEQ.pack(1), *stream.next_piece()])
    _wait_until(lambda: d.num_refused("stale") == 1)
    assert np.array_equal(blocks, after) and d.poll() is None


def test_the_io_thread_stops_at_close():
    p, d = ZmqTransport(listen="127.0.0.1:0"), ZmqTransport()
    assert {t.name for t in threading.enumerate()} >= {"pd-connector-io"}
    p.close()
    d.close()
    d.close()   # a second close does nothing
    assert not p._thread.is_alive() and not d._thread.is_alive()
    assert "closed" in d.reserve("r0", "127.0.0.1:1")   # refused as a value: nothing waits for a stopped thread


def _stream_then(stream: OutgoingStream, kind: str, frames: list) -> list[tuple[str, list]]:
    return [(STREAM, [stream.header]), (kind, frames)]


def _with_field(header: bytes, **fields) -> bytes:
    magic, version, _ = PREFIX.unpack_from(header)
    changed = json.dumps({**json.loads(header[PREFIX.size:]), **fields}).encode()
    return PREFIX.pack(magic, version, len(changed)) + changed


HOSTILE = {   # name -> (messages after the reservation, the refusal counted); each fails only D's own request
    "header not a hand-off": (lambda s: [(STREAM, [b"FDPD?" + s.header[5:]])], "malformed"),
    "header of another version": (lambda s: [(STREAM, [s.header[:4] + b"\x02\x00" + s.header[6:]])], "malformed"),
    "header cut short": (lambda s: [(STREAM, [s.header[:-3]])], "malformed"),
    "header without kv descriptors": (lambda s: [(STREAM, [s.header[:10] + b"{}"])], "malformed"),
    "header with a kv_start not an int": (lambda s: [(STREAM, [_with_field(s.header, kv_start="16")])], "malformed"),
    "piece without its bytes": (lambda s: _stream_then(s, KV, [SEQ.pack(0)]), "malformed"),
    "piece index not 8 bytes": (lambda s: _stream_then(s, KV, [b"\x00", b"x" * 8]), "malformed"),
    "trailer not JSON": (lambda s: _stream_then(s, END, [b"\xff\xfe"]), "malformed"),
    "trailer with other fields": (lambda s: _stream_then(s, END, [b'{"pieces":0,"tag":"00","x":1}']),
                                  "malformed"),
    "piece beyond the reservation": (lambda s: _stream_then(s, KV, [SEQ.pack(0), b"x" * (s.kv_nbytes + 8)]),
                                     "oversized"),
    "trailer too early": (lambda s: _stream_then(s, END, [s.trailer()]), "malformed"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_stream_fails_only_its_own_request_and_d_keeps_serving(pair, case):
    p, d = pair()
    kv = np.arange(2 * TOKENS * ROW, dtype=np.float32)
    stream = OutgoingStream.of(_message("r-bad", d.handoff_key), [kv], d.handoff_key)
    blocks, identity, nonce = _reserve(d, p, "r-bad", kv.nbytes)
    make, reason = HOSTILE[case]
    for kind, frames in make(stream):
        p.send(identity, kind, "r-bad", nonce, frames)
    envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
    assert envelope.request_id == "r-bad" and envelope.error and envelope.kv_landed is None
    if "kv_start" in case:
        assert "header is unreadable" in envelope.error and "`$.kv_start`" in envelope.error, envelope.error
    assert d.num_refused(reason) == 1 and not blocks.any()
    good = OutgoingStream.of(_message("r-good", d.handoff_key), [kv], d.handoff_key)   # D keeps serving
    _, identity, nonce = _reserve(d, p, "r-good", kv.nbytes)
    p.send(identity, STREAM, "r-good", nonce, [good.header])
    while (piece := good.next_piece()) is not None:
        p.send(identity, KV, "r-good", nonce, [SEQ.pack(good.num_pieces - 1), *piece])
    p.send(identity, END, "r-good", nonce, [good.trailer()])
    envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
    assert envelope.request_id == "r-good" and envelope.error is None and envelope.kv_landed == kv.nbytes


def _placed(rid: str, tokens: int, key) -> HandoffMessage:
    spec = KVSpec("<f4", (tokens, ROW))
    return HandoffMessage.create_streamed(
        request_id=rid, prompt_token_ids=[1] * tokens, sampling=HandoffSamplingParams(max_tokens=4), t0=3,
        draft_token_ids=[3], placed_kv=PlacedKV((spec, spec), ()), config_hash=CONFIG, key=key)


@pytest.mark.parametrize("run_kib", [4, 384], ids=["small-runs-copied", "large-runs-as-views"])
def test_a_piece_of_scattered_blocks_is_one_message_landed_in_order(pair, run_kib):
    """Runs of P's blocks go in one piece: as frames that are views of the blocks when the runs are large, as one
    copy when they are small (a frame costs more than copying it)."""
    p, d = pair()
    tokens = 3 * run_kib * 1024 // (2 * ROW * 4)
    kv = np.random.default_rng(1).standard_normal(2 * tokens * ROW, dtype=np.float32)
    blocks = kv.view(np.uint8)
    run = run_kib * 1024
    scattered = [blocks[:run], blocks[run:2 * run], blocks[2 * run:]]   # three runs of P's blocks, say
    stream = OutgoingStream.of(_placed("r0", tokens, d.handoff_key), scattered, d.handoff_key)
    stream.piece_bytes = kv.nbytes
    piece = stream.next_piece()
    assert stream.next_piece() is None
    if run_kib < 256:
        assert len(piece) == 1 and isinstance(piece[0], bytes) and len(piece[0]) == kv.nbytes
    else:
        assert [f.nbytes for f in piece] == [run] * 3
        assert all(np.shares_memory(np.frombuffer(f, np.uint8), blocks) for f in piece), "sent from P's blocks"
    landed, identity, nonce = _reserve(d, p, "r0", kv.nbytes)
    p.send(identity, STREAM, "r0", nonce, [stream.header])
    p.send(identity, KV, "r0", nonce, [SEQ.pack(0), *piece])
    p.send(identity, END, "r0", nonce, [stream.trailer()])
    envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
    assert envelope.error is None and envelope.kv_landed == kv.nbytes
    assert np.array_equal(landed, blocks)


def _silent_d(p: ZmqTransport, rid: str) -> zmq.Socket:
    """A raw D that reserved `rid` at P and then reads nothing: P's pieces back up into P's libzmq queue."""
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.RCVHWM, 1)
    d.setsockopt(zmq.RCVBUF, 4096)
    d.connect(f"tcp://{p.address}")
    d.send_multipart([header_frame(MessageTagger(None), "reserve", rid, "ab" * 16, [])])
    assert reservation_ids(p)(Deadline.after(CLOCK, WAIT_S)) == rid
    return d


def test_p_reports_a_stream_done_once_handed_over_while_libzmq_still_holds_copies_of_its_pieces():
    """The pieces are copied out of P's blocks as they are handed to libzmq (SERVICES §6, a partition in the
    middle of a hand-off): a stream whose D reads nothing is reported done as soon as its trailer is queued, and
    what libzmq then delivers is what the blocks held when it was sent, whatever they hold since."""
    p = ZmqTransport(listen="127.0.0.1:0")
    d = _silent_d(p, "r0")
    try:
        tokens = 8 * 1024                           # 4 MiB over 2 layers: far beyond the kernel's buffers
        kv = np.ones(2 * tokens * ROW, np.float32)
        p.send_stream("r0", OutgoingStream.of(_placed("r0", tokens, p.handoff_key), [kv], p.handoff_key))
        done = []
        _wait_until(lambda: done.extend(p.finished_sends()) or done)
        assert done == [("r0", None)] and p.kv_bytes_sent == kv.nbytes
        kv[...] = 0.0                               # the blocks go to another request
        got = 0
        while True:
            assert d.poll(int(WAIT_S * 1000)), "P's queued pieces did not arrive"
            header, *body = d.recv_multipart()
            kind = json.loads(header)["kind"]
            if kind == KV:
                assert all(np.all(np.frombuffer(f, np.float32) == 1.0) for f in body[1:]), "a piece changed"
                got += sum(len(f) for f in body[1:])
            if kind == END:
                break
        assert got == kv.nbytes
    finally:
        d.close(linger=0)
        p.close()


def test_a_stream_forgotten_while_its_d_reads_nothing_is_reported_at_once():
    """P forgets a stream at its KV_TRANSFER deadline while its D (partitioned, here: reading nothing) holds back
    the rest: the stream is reported failed at once, so P frees its blocks then, though libzmq still holds the
    copies of the pieces queued for that D."""
    p = ZmqTransport(listen="127.0.0.1:0", capacity=2)   # a queue of 2 messages: the stream stalls early
    d = _silent_d(p, "r0")
    try:
        tokens = 32 * 1024                          # 16 MiB: it cannot all be queued
        kv = np.ones(2 * tokens * ROW, np.float32)
        p.send_stream("r0", OutgoingStream.of(_placed("r0", tokens, p.handoff_key), [kv], p.handoff_key))
        _wait_until(lambda: p.kv_bytes_sent > 0)
        assert p.finished_sends() == [] and p.kv_bytes_sent < kv.nbytes
        p.forget("r0")
        done = []
        _wait_until(lambda: done.extend(p.finished_sends()) or done)
        assert done[0][0] == "r0" and "given up" in done[0][1]
    finally:
        d.close(linger=0)
        p.close()


def test_a_stream_for_a_request_no_d_reserved_is_reported_failed_not_raised():
    """send_stream returns at once (P's step does not wait for the I/O thread); a stream that cannot start, here
    for an id no D reserved, is reported in finished_sends with why, so its blocks go back."""
    p = ZmqTransport(listen="127.0.0.1:0")
    try:
        kv = np.ones(2 * TOKENS * ROW, np.float32)
        p.send_stream("r-nobody", OutgoingStream.of(_message("r-nobody", p.handoff_key), [kv], p.handoff_key))
        done = []
        _wait_until(lambda: done.extend(p.finished_sends()) or done)
        assert done[0][0] == "r-nobody" and "no D has reserved it" in done[0][1]
        assert p.kv_bytes_sent == 0
    finally:
        p.close()
