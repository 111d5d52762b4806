"""The ZeroMQ connector between two processes on 127.0.0.1 (SERVICES §7, PD_MTP_FLOW §3, I10): reservations D→P,
hand-offs P→D as frames decoded bit-exactly, acknowledgements D→P; a message with a wrong or missing key is
refused and counted; every wait ends at its deadline."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from fastdeploy.splitwise import (
    Deadline,
    HandoffMessage,
    MonotonicClock,
    ReceiptCheck,
    Reject,
    TransportFullError,
    receive_handoff,
)
from fastdeploy.splitwise.integrity import canonical_json
from fastdeploy.splitwise.secret import MessageTagger, load_pd_secret
from fastdeploy.splitwise.zmq_transport import ZmqTransport

from .handoff_factory import assert_same_message, make_message

REPO = Path(__file__).resolve().parents[2]
CLOCK = MonotonicClock()
WAIT_S = 10.0    # generous upper bound of each wait: a test never hangs, and never asserts on time


class PeerP:
    """The P side (tests/splitwise/zmq_peer.py) in a child process; always stopped, even when a test fails."""

    def __init__(self, *args: str):
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.splitwise.zmq_peer", *args], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line, f"peer did not start: {self.proc.stderr.read()}"
        self.address = json.loads(line)["address"]

    def summary(self) -> dict:
        out, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def peer_p():
    peers = []

    def start(*args: str) -> PeerP:
        peers.append(PeerP(*args))
        return peers[-1]

    yield start
    for peer in peers:
        peer.stop()


@pytest.fixture
def transports():
    made = []

    def make(**kwargs) -> ZmqTransport:
        made.append(ZmqTransport(**kwargs))
        return made[-1]

    yield make
    for transport in made:
        transport.close()


def test_reservation_handoff_and_ack_cross_processes_bit_exact(peer_p, transports):
    """SERVICES §6 steps 2–4 over SERVICES §7: each reservation from D reaches P, P's hand-off (KV arrays as their own
    frames) decodes on D into exactly the message P built, and each ack reaches P."""
    peer = peer_p("--secret", "s3cret", "--expect-acks", "3")
    d = transports(secret=b"s3cret")
    for i in range(3):
        d.reserve(f"r{i}", peer.address)
    for _ in range(3):
        envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
        assert envelope is not None, "no hand-off within the wait"
        assert isinstance(envelope.payload, tuple) and len(envelope.payload) == 4    # header + 3 KV layers
        i = int(envelope.request_id[1:])
        assert_same_message(HandoffMessage.decode(envelope.payload), make_message(seed=i, request_id=f"r{i}"))
        d.ack(envelope.request_id)
    summary = peer.summary()
    assert sorted(summary["reservations"]) == sorted(summary["acks"]) == ["r0", "r1", "r2"]
    assert summary["refused"] == {"bad_tag": 0, "malformed": 0, "unexpected_kind": 0}
    assert d.num_handoffs_received == 3 and d.num_refused() == 0


@pytest.mark.parametrize("d_secret", [b"other", None], ids=["wrong-key", "missing-key"])
def test_message_without_the_right_key_is_refused_and_counted(peer_p, transports, d_secret):
    """SERVICES §7 authenticity: P with a secret refuses a reservation keyed differently or not at all, counts it
    under bad_tag and computes nothing; its refusal reaches D, which cannot verify it either, so D's poll yields
    only an error for each of its requests (no payload), naming the tag, instead of D waiting for its deadline."""
    peer = peer_p("--secret", "s3cret", "--expect-refused", "2")
    d = transports(secret=d_secret)
    d.reserve("r0", peer.address)
    d.reserve("r1", peer.address)
    summary = peer.summary()
    assert summary["refused"]["bad_tag"] == 2 and summary["reservations"] == []
    refusals = [d.poll(Deadline.after(CLOCK, WAIT_S)) for _ in range(2)]
    assert sorted(e.request_id for e in refusals) == ["r0", "r1"]
    assert all(e.payload == () and "tag did not verify" in e.error for e in refusals)
    assert d.num_refused("bad_tag") == 2 and d.num_handoffs_received == 0


def test_malformed_frames_are_refused_and_the_connector_keeps_serving(peer_p, transports):
    """A peer sending garbage (not JSON, wrong header keys, an unknown kind) is refused as malformed without
    disturbing the next, well-formed reservation."""
    peer = peer_p("--expect-acks", "1", "--expect-refused", "3")
    context = zmq.Context.instance()
    rogue = context.socket(zmq.DEALER)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(f"tcp://{peer.address}")
    try:
        rogue.send_multipart([b"\xff not json"])
        rogue.send_multipart([b'{"kind":"reserve"}'])
        rogue.send_multipart([b'{"kind":"steal","request_id":"r0","tag":"00","v":1}'])
        d = transports()
        d.reserve("r5", peer.address)
        envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
        assert envelope is not None and envelope.request_id == "r5"
        d.ack("r5")
        summary = peer.summary()
    finally:
        rogue.close()
    assert summary["refused"]["malformed"] == 3 and summary["acks"] == ["r5"]


def test_damaged_header_frame_is_refused_and_damaged_kv_fails_the_inner_tag(transports):
    """SERVICES §7 (hash-then-MAC): the keyed connector tag covers the header fields, the frame count and the
    hand-off's header frame, which carries the hand-off's own tag over every KV byte. A damaged header frame is
    refused as bad_tag and D gets only an error for the request it reserved (no payload); a damaged KV frame passes
    the connector and is rejected at receipt by the inner tag (PD_MTP_FLOW §5.2 step 1). A bare ROUTER plays P,
    tagging the intact frames with the shared key."""
    rogue_p = zmq.Context.instance().socket(zmq.ROUTER)
    rogue_p.setsockopt(zmq.LINGER, 0)
    port = rogue_p.bind_to_random_port("tcp://127.0.0.1")
    try:
        d = transports(secret=b"k")
        d.reserve("r0", f"127.0.0.1:{port}")
        assert rogue_p.poll(int(WAIT_S * 1000)), "no reservation reached the rogue P"
        identity = rogue_p.recv_multipart()[0]
        fields = {"kind": "handoff", "request_id": "r0", "v": 1}
        message = make_message(seed=0, request_id="r0")
        frames = message.encode_frames()
        tag = MessageTagger(b"k").tag(canonical_json({**fields, "frames": len(frames)}), frames[:1])
        header = canonical_json({**fields, "tag": tag})

        def flip_last_byte(frame) -> bytes:
            return bytes(frame[:-1]) + bytes([frame[-1] ^ 1])

        rogue_p.send_multipart([identity, header, flip_last_byte(frames[0]), *frames[1:]])
        refused = d.poll(Deadline.after(CLOCK, WAIT_S))
        assert (refused.request_id, refused.payload) == ("r0", ()) and "tag did not verify" in refused.error
        assert d.num_refused("bad_tag") == 1 and d.num_handoffs_received == 0

        rogue_p.send_multipart([identity, header, *frames[:-1], flip_last_byte(frames[-1])])
        delivered = d.poll(Deadline.after(CLOCK, WAIT_S))
        assert delivered is not None and delivered.error is None and d.num_refused("bad_tag") == 1
        verdict = receive_handoff("r0", delivered.payload, config_hash=message.config_hash,
                                  num_speculative_tokens=1)
        assert isinstance(verdict, Reject) and verdict.check is ReceiptCheck.INTEGRITY and "tag" in verdict.error

        rogue_p.send_multipart([identity, header, *frames])
        envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
        assert envelope is not None and HandoffMessage.decode(envelope.payload).tag == message.tag
    finally:
        rogue_p.close()


def test_waits_end_at_their_deadline_and_a_vanished_peer_is_an_error(transports):
    """I10: every poll returns None once its deadline passes with nothing received (never a blocking recv), and a
    hand-off for a D that has gone raises TransportFullError instead of disappearing."""
    p = transports(listen="127.0.0.1:0")
    d = transports()
    for poll in (p.poll_reservation, p.poll_ack, d.poll):
        assert poll(Deadline.after(CLOCK, 0.05)) is None
        assert poll() is None
    d.reserve("r0", p.address)
    assert p.poll_reservation(Deadline.after(CLOCK, WAIT_S)) == "r0"
    d.close()
    frames = make_message(seed=0, request_id="r0").encode_frames()
    with pytest.raises(TransportFullError, match="not connected"):
        for _ in range(200):    # bounded: P notices the closed connection within a few polls
            p.poll_ack(Deadline.after(CLOCK, 0.01))
            p.send("r0", frames)
    with pytest.raises(ValueError, match="no D has reserved"):
        p.send("r9", frames)


def test_arguments_are_validated():
    """Bad addresses and sizes are ValueErrors naming the argument."""
    with pytest.raises(ValueError, match="'listen'"):
        ZmqTransport(listen="nowhere")
    with pytest.raises(ValueError, match="'capacity'"):
        ZmqTransport(capacity=0)
    transport = ZmqTransport()
    try:
        with pytest.raises(ValueError, match="'prefill_addr'"):
            transport.reserve("r0", None)
        with pytest.raises(ValueError, match="'prefill_addr'"):
            transport.reserve("r0", "no-port")
    finally:
        transport.close()


def test_secret_comes_from_the_file_then_the_environment(tmp_path):
    """SERVICES §7: --pd-secret-file wins over FD_PD_SECRET; an empty secret is an error naming its source."""
    path = tmp_path / "secret"
    path.write_bytes(b"  from-file\n")
    assert load_pd_secret(str(path), {"FD_PD_SECRET": "from-env"}) == b"from-file"
    assert load_pd_secret(None, {"FD_PD_SECRET": "from-env"}) == b"from-env"
    assert load_pd_secret(None, {}) is None
    path.write_bytes(b"\n")
    with pytest.raises(ValueError, match="--pd-secret-file"):
        load_pd_secret(str(path), {})
    with pytest.raises(ValueError, match="FD_PD_SECRET"):
        load_pd_secret(None, {"FD_PD_SECRET": " "})
