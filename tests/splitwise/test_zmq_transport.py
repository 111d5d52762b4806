"""The ZeroMQ connector between two processes on 127.0.0.1 (SERVICES §7, PD_MTP_FLOW §3, I10): reservations D→P,
hand-offs P→D as frames decoded bit-exactly, acknowledgements D→P; a message with a wrong or missing key is
refused and counted; every wait ends at its deadline."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from fastdeploy.splitwise import (
    PROTOCOL_VERSION,
    Deadline,
    HandoffKey,
    HandoffMessage,
    MonotonicClock,
    ReceiptCheck,
    Reject,
    receive_handoff,
)
from fastdeploy.splitwise.integrity import canonical_json
from fastdeploy.splitwise.secret import load_pd_secret
from fastdeploy.splitwise.zmq_transport import ZmqTransport

from .handoff_factory import assert_same_message, make_message
from .rogue import header, holding_secret, nonce_of
from .fakes import reservation_ids

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
    assert set(summary["refused"].values()) == {0}
    assert d.num_handoffs_received == 3 and d.num_refused() == 0


@pytest.mark.parametrize("d_secret", [b"other", None], ids=["wrong-key", "missing-key"])
def test_a_d_without_the_right_key_completes_no_connection(transports, d_secret):
    """SERVICES §7 authenticity (peer_auth.py): a P with a secret takes nothing from a D keyed differently or not
    at all. The transport's handshake fails, so no frame of D's is delivered (no reservation, nothing to count)
    and D never sees that P ready, so D's engine gives such requests no slot and fails them at the
    reservation-ack deadline (tests/pd/test_pd_dead_prefill.py)."""
    p = transports(listen="127.0.0.1:0", secret=b"s3cret")
    d = transports(secret=d_secret)
    d.reserve("r0", p.address)
    for _ in range(25):   # half a second at least: the handshake on loopback takes milliseconds
        assert reservation_ids(p)(Deadline.after(CLOCK, 0.02)) is None
        assert not d.peer_ready(p.address)
    assert p.num_refused() == 0 and d.num_refused() == 0


def test_malformed_frames_are_refused_and_the_connector_keeps_serving(peer_p, transports):
    """A peer sending garbage (not JSON, wrong header keys, an unknown kind) is refused (malformed, unknown kind)
    without disturbing the next, well-formed reservation."""
    peer = peer_p("--expect-acks", "1", "--expect-refused", "3")
    context = zmq.Context.instance()
    rogue = context.socket(zmq.DEALER)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(f"tcp://{peer.address}")
    try:
        rogue.send_multipart([b"\xff not json"])
        rogue.send_multipart([b'{"kind":"reserve"}'])
        rogue.send_multipart([b'{"kind":"steal","request_id":"r0","tag":"00","v":%d}' % PROTOCOL_VERSION])
        d = transports()
        d.reserve("r5", peer.address)
        envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
        assert envelope is not None and envelope.request_id == "r5"
        d.ack("r5")
        summary = peer.summary()
    finally:
        rogue.close()
    assert summary["refused"]["malformed"] == 2 and summary["refused"]["unknown_kind"] == 1
    assert summary["acks"] == ["r5"]


def test_damaged_header_frame_is_refused_and_damaged_kv_fails_the_inner_tag(transports):
    """SERVICES §7 (v2): the keyed connector tag covers the header fields, the frame count and the hand-off's
    header frame, never a KV frame: the hand-off's own keyed tag covers every KV byte. A damaged header frame is
    refused as bad_tag and D gets only an error for the request it reserved (no payload); a damaged KV frame passes
    the connector and is rejected at receipt by the hand-off's tag (PD_MTP_FLOW §5.2 step 1). A bare ROUTER plays P,
    tagging the intact frames with the shared key."""
    rogue_p = holding_secret(zmq.Context.instance().socket(zmq.ROUTER), b"k", server=True)
    rogue_p.setsockopt(zmq.LINGER, 0)
    port = rogue_p.bind_to_random_port("tcp://127.0.0.1")
    try:
        d = transports(secret=b"k")
        key = HandoffKey.from_secret(b"k")
        message = make_message(seed=0, request_id="r0", key=key)
        frames = message.encode_frames()

        def flip_last_byte(frame) -> bytes:
            return bytes(frame[:-1]) + bytes([frame[-1] ^ 1])

        def answer(damage_header: bool, damage_kv: bool):
            """Reserve r0 anew and answer the reservation with the (damaged) hand-off, tagged as sent."""
            d.reserve("r0", f"127.0.0.1:{port}")
            assert rogue_p.poll(int(WAIT_S * 1000)), "no reservation reached the rogue P"
            identity, reservation = rogue_p.recv_multipart()[:2]
            head = header("handoff", "r0", nonce_of(reservation), frames, secret=b"k")
            body = [flip_last_byte(frames[0]) if damage_header else frames[0], *frames[1:-1],
                    flip_last_byte(frames[-1]) if damage_kv else frames[-1]]
            rogue_p.send_multipart([identity, head, *body])
            return d.poll(Deadline.after(CLOCK, WAIT_S))

        refused = answer(damage_header=True, damage_kv=False)
        assert (refused.request_id, refused.payload) == ("r0", ()) and "tag did not verify" in refused.error
        assert d.num_refused("bad_tag") == 1 and d.num_handoffs_received == 0

        delivered = answer(damage_header=False, damage_kv=True)
        assert delivered is not None and delivered.error is None and d.num_refused("bad_tag") == 1
        verdict = receive_handoff("r0", delivered.payload, config_hash=message.config_hash,
                                  num_speculative_tokens=1, key=d.handoff_key)
        assert isinstance(verdict, Reject) and verdict.check is ReceiptCheck.INTEGRITY and "tag" in verdict.error

        envelope = answer(damage_header=False, damage_kv=False)
        assert envelope is not None and HandoffMessage.decode(envelope.payload).tag == message.tag
        verdict = receive_handoff("r0", envelope.payload, config_hash=message.config_hash,
                                  num_speculative_tokens=1, key=d.handoff_key)
        assert not isinstance(verdict, Reject), verdict
    finally:
        rogue_p.close()


def _poll_until(poll, done, attempts: int = 500) -> list:
    """Everything `poll` yields until `done(seen)` holds (bounded: each poll waits 20 ms at most)."""
    seen: list = []
    for _ in range(attempts):
        got = poll(Deadline.after(CLOCK, 0.02))
        if got is not None:
            seen.append(got)
        if done(seen):
            return seen
    raise AssertionError(f"condition not reached; polled {seen}")


def _v1_message(kind: str, request_id: str) -> list[bytes]:
    """A connector message as a build on protocol version 1 sends it (BLAKE2b tag, "v": 1)."""
    fields = {"kind": kind, "request_id": request_id, "v": 1}
    tag = hashlib.blake2b(canonical_json({**fields, "frames": 0}), digest_size=16, person=b"fd-pd-zmq").hexdigest()
    return [canonical_json({**fields, "tag": tag})]


def test_a_d_still_on_v1_is_refused_naming_both_versions(transports, caplog):
    """SERVICES §6 (a peer still on v1): P refuses a reservation of protocol version 1, counts it under 'version'
    and logs both versions; it computes nothing for it and keeps serving v2 peers."""
    p = transports(listen="127.0.0.1:0")
    old_d = zmq.Context.instance().socket(zmq.DEALER)
    old_d.setsockopt(zmq.LINGER, 0)
    old_d.connect(f"tcp://{p.address}")
    try:
        old_d.send_multipart(_v1_message("reserve", "r-old"))
        new_d = transports()
        new_d.reserve("r-new", p.address)
        with caplog.at_level(logging.WARNING, logger="fastdeploy.splitwise.zmq_transport"):
            seen = _poll_until(reservation_ids(p), lambda got: "r-new" in got and p.num_refused("version") == 1)
        assert seen == ["r-new"] and p.num_refused("version") == 1
        assert f"protocol version 1; this build speaks version {PROTOCOL_VERSION}" in caplog.text
    finally:
        old_d.close()


def test_a_p_still_on_v1_fails_the_request_at_once_naming_both_versions(transports):
    """SERVICES §6 (a peer still on v1): a v1 answer from the P a request was reserved at fails that request at
    once on D (no payload, an error naming both versions) instead of at its deadline."""
    old_p = zmq.Context.instance().socket(zmq.ROUTER)
    old_p.setsockopt(zmq.LINGER, 0)
    port = old_p.bind_to_random_port("tcp://127.0.0.1")
    try:
        d = transports()
        d.reserve("r0", f"127.0.0.1:{port}")
        assert old_p.poll(int(WAIT_S * 1000)), "no reservation reached the v1 P"
        identity = old_p.recv_multipart()[0]
        old_p.send_multipart([identity, *_v1_message("handoff", "r0")])
        envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
        assert envelope is not None and envelope.payload == () and envelope.request_id == "r0"
        assert f"protocol version 1; this build speaks version {PROTOCOL_VERSION}" in envelope.error
        assert d.num_refused("version") == 1 and d.num_handoffs_received == 0
    finally:
        old_p.close()


def test_reservation_data_reaches_p_and_is_under_the_connector_tag(transports):
    """D's reservation may carry data (the destination of its blocks for a one-sided transfer): P polls it with
    the reservation, bit-exact; the connector tag covers it, so changed data is refused as bad_tag."""
    p = transports(listen="127.0.0.1:0", secret=b"k")
    d = transports(secret=b"k")
    data = {"mooncake": {"session": "127.0.0.1:5", "block_ids": [3, 1], "layers": [[4096, 96]]}}
    d.reserve("r0", p.address, data=data)
    d.reserve("r1", p.address)
    first = p.poll_reservation_with_data(Deadline.after(CLOCK, WAIT_S))
    assert (first.request_id, first.data) == ("r0", data)
    assert reservation_ids(p)(Deadline.after(CLOCK, WAIT_S)) == "r1"    # the old shape still works

    rogue = holding_secret(zmq.Context.instance().socket(zmq.DEALER), b"k")   # past the handshake, data changed
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(f"tcp://{p.address}")
    try:
        body = canonical_json(data)
        head = header("reserve", "r2", "0" * 32, [body], secret=b"k")
        rogue.send_multipart([head, body.replace(b"4096", b"8192")])
        assert _poll_until(reservation_ids(p), lambda _: p.num_refused("bad_tag") == 1) == []
    finally:
        rogue.close()
    with pytest.raises(ValueError, match="'data' must be a dict"):
        d.reserve("r3", p.address, data=["not", "a", "dict"])


def test_waits_end_at_their_deadline_and_a_vanished_peer_is_an_error(transports):
    """I10: every poll returns None once its deadline passes with nothing received (never a blocking recv), and a
    hand-off for a D that has gone is reported failed at `finished_sends` (P fails it now) instead of
    disappearing; so is one for a request no D reserved."""
    p = transports(listen="127.0.0.1:0")
    d = transports()
    for poll in (reservation_ids(p), p.poll_ack, d.poll):
        assert poll(Deadline.after(CLOCK, 0.05)) is None
        assert poll() is None
    rids = [f"r{i}" for i in range(20)]
    for rid in rids:
        d.reserve(rid, p.address)
    assert [reservation_ids(p)(Deadline.after(CLOCK, WAIT_S)) for _ in rids] == rids
    d.close()
    frames = make_message(seed=0, request_id="r0").encode_frames()
    reports = []
    for rid in rids:    # bounded: P notices the closed connection within a few polls
        p.poll_ack(Deadline.after(CLOCK, 0.01))
        p.send(rid, frames)
        reports += _until(p.finished_sends)   # sent (into the connection P has not yet seen closed), or not
        if reports[-1][1] is not None:
            break
    assert "not connected" in reports[-1][1] and all(error is None for _, error in reports[:-1])
    p.send("never-reserved", frames)
    assert _until(p.finished_sends)[0][1].count("no D has reserved") == 1


def _until(read, attempts: int = 500) -> list:
    for _ in range(attempts):   # bounded: each try waits 10 ms
        got = read()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError("nothing was reported")


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
