"""The hostile-peer battery at the connector (SERVICES §7, docs/design.md §8): every malformed, oversized,
mistyped, deeply nested, replayed, duplicated or misdirected message a rogue D sends P's port, or a rogue P sends
D, is refused by the reason its catalogue entry names and counted, never raises out of `poll`, and disturbs no
other exchange; routes stay with their first reserver; D's DEALERs stay bounded. With and without a secret: with
one, the rogue holds the secret's transport keys (a stranger delivers nothing at all, test_strangers.py), so its
messages reach the checks behind the handshake, and it tags them without the key."""
from __future__ import annotations

import collections
import os

import pytest
import zmq

from fastdeploy.splitwise import PROTOCOL_VERSION, Deadline, MonotonicClock, ReceiptCheck, Reject, receive_handoff
from fastdeploy.splitwise.wire import MAGIC, PREFIX
from fastdeploy.splitwise.zmq_transport import ZmqTransport

from .handoff_factory import make_message
from .rogue import header, holding_secret, nonce_of, to_d, to_p
from .fakes import reservation_ids

CLOCK = MonotonicClock()
WAIT_S = 10.0
SECRETS = [None, b"hostile-battery-secret"]


@pytest.fixture
def sockets():
    made = []

    def make(kind=None, holding=None, **kwargs):
        if kind is None:
            made.append(ZmqTransport(**kwargs))
        else:
            socket = zmq.Context.instance().socket(kind)
            socket.setsockopt(zmq.LINGER, 0)
            made.append(holding_secret(socket, holding, server=kind == zmq.ROUTER))
        return made[-1]

    yield make
    for item in made:
        item.close()


def _drain(poll, done, attempts: int = 500) -> list:
    seen = []
    for _ in range(attempts):   # bounded: each poll waits 20 ms at most
        got = poll(Deadline.after(CLOCK, 0.02))
        if got is not None:
            seen.append(got)
        if done(seen):
            return seen
    raise AssertionError(f"condition not reached; polled {seen}")


@pytest.mark.parametrize("secret", SECRETS, ids=["no-secret", "secret"])
def test_p_refuses_every_hostile_frame_by_its_reason_and_keeps_serving(sockets, secret):
    p = sockets(listen="127.0.0.1:0", secret=secret)
    rogue = sockets(zmq.DEALER, holding=secret)
    rogue.connect(f"tcp://{p.address}")
    catalogue = to_p("h")
    for hostile in catalogue:
        rogue.send_multipart(hostile.frames)
    good = sockets(secret=secret)
    good.reserve("good", p.address)
    expected = collections.Counter(h.reason_with(secret is not None) for h in catalogue)
    accepted = sorted(["good"] + ([] if secret else ["h-17", "h-18"]))
    del expected[""]
    seen = _drain(reservation_ids(p), lambda got: sorted(got) == accepted
                  and p.num_refused() == sum(expected.values()))
    assert sorted(seen) == accepted
    assert {reason: n for reason, n in p.refused_counts().items() if n} == dict(expected)
    p.send("good", make_message(seed=1, request_id="good").encode_frames())   # P still serves its true D
    assert _drain(good.poll, lambda got: len(got) == 1)[0].error is None
    good.ack("good")
    assert _drain(p.poll_ack, lambda got: got == ["good"]) == ["good"]
    if secret is None:   # the duplicate was answered, to its own nonce, naming why
        answers = []
        while rogue.poll(200):
            answers.append(rogue.recv_multipart())
        assert any(nonce_of(frames[0]) == "ab" * 16 and b"duplicate" in frames[-1] for frames in answers)


@pytest.mark.parametrize("secret", SECRETS, ids=["no-secret", "secret"])
def test_d_refuses_what_a_rogue_p_sends_and_fails_only_its_own_request(sockets, secret):
    rogue_p = sockets(zmq.ROUTER, holding=secret)
    port = rogue_p.bind_to_random_port("tcp://127.0.0.1")
    d = sockets(secret=secret)
    d.reserve("d0", f"127.0.0.1:{port}")
    assert rogue_p.poll(int(WAIT_S * 1000))
    identity, reservation = rogue_p.recv_multipart()
    nonce = nonce_of(reservation)
    catalogue = to_d("d0", nonce)
    refusal = b'{"reason":"duplicate"}'   # P's answer to the reservation, tagged without a key
    for frames in [*(h.frames for h in catalogue), [header("refuse", "d0", nonce, [refusal]), refusal]]:
        rogue_p.send_multipart([identity, *frames])
    expected = collections.Counter(h.reason_with(secret is not None) for h in catalogue)
    if secret:   # with a secret, the keyless P's first message for d0 fails it (the tag), the rest are refused
        expected["bad_tag"] += 1
    envelopes = _drain(d.poll, lambda got: d.num_refused() == sum(expected.values()) and len(got) == 1)
    assert {reason: n for reason, n in d.refused_counts().items() if n} == dict(expected)
    assert [(e.request_id, e.payload) for e in envelopes] == [("d0", ())]
    assert ("tag did not verify" if secret else "another reservation of this request id") in envelopes[0].error
    d.ack("d0")
    d.ack("d0")   # a second ack of the same id is a no-op, never an error


def test_two_answers_for_one_id_in_one_drain_deliver_one(sockets):
    """docs/design.md §8: two hand-offs for one id arrive together; D delivers the first and refuses the second
    as stale (it never becomes a second envelope to acknowledge)."""
    rogue_p = sockets(zmq.ROUTER)
    port = rogue_p.bind_to_random_port("tcp://127.0.0.1")
    d = sockets()
    d.reserve("r0", f"127.0.0.1:{port}")
    assert rogue_p.poll(int(WAIT_S * 1000))
    identity, reservation = rogue_p.recv_multipart()
    frames = make_message(seed=2, request_id="r0").encode_frames()
    head = header("handoff", "r0", nonce_of(reservation), frames)
    rogue_p.send_multipart([identity, head, *frames])
    rogue_p.send_multipart([identity, head, *frames])
    delivered = _drain(d.poll, lambda got: d.num_refused("stale") == 1)
    assert [e.request_id for e in delivered] == ["r0"] and delivered[0].error is None
    d.ack("r0")


def test_a_duplicate_reservation_never_reroutes_the_handoff(sockets):
    """docs/design.md §8: the route stays with the first reserver: the hand-off reaches it, and the second D is
    told at once (a refusal with its own nonce)."""
    p = sockets(listen="127.0.0.1:0")
    first, second = sockets(), sockets()
    first.reserve("r0", p.address)
    assert _drain(reservation_ids(p), lambda got: got == ["r0"]) == ["r0"]
    second.reserve("r0", p.address)
    for _ in range(25):   # P reads the second reservation (and must not rebind the route to it)
        reservation_ids(p)(Deadline.after(CLOCK, 0.02))
    p.send("r0", make_message(seed=3, request_id="r0").encode_frames())
    received = first.poll(Deadline.after(CLOCK, WAIT_S))
    assert received is not None and received.request_id == "r0" and received.error is None
    refusal = second.poll(Deadline.after(CLOCK, WAIT_S))
    assert refusal is not None and refusal.payload == () and "another reservation" in refusal.error
    assert p.num_refused("duplicate") == 1


def test_frames_that_crashed_p_are_refused_with_and_without_a_secret(sockets):
    """docs/design.md §8: a non-ASCII tag (compared as bytes now), a kind that is a list, a header nested past
    the recursion limit and reservation data nested past it: each is refused; P keeps serving."""
    for secret in SECRETS:
        p = sockets(listen="127.0.0.1:0", secret=secret)
        rogue = sockets(zmq.DEALER, holding=secret)
        rogue.connect(f"tcp://{p.address}")
        deep = b"[" * 1000 + b"]" * 1000
        v = b'"v":%d}' % PROTOCOL_VERSION
        rogue.send_multipart([('{"kind":"reserve","request_id":"r1","tag":"' + "é" * 32 + '",').encode() + v])
        rogue.send_multipart([b'{"kind":[],"request_id":"r2","tag":"00",' + v])
        rogue.send_multipart([b'{"kind":' + deep + b',"request_id":"r3","tag":"00",' + v])
        rogue.send_multipart([b'{"kind":"reserve","request_id":"r4","tag":"00",' + v, b"[" * 100000])
        good = sockets(secret=secret)
        good.reserve("good", p.address)
        assert _drain(reservation_ids(p), lambda got: "good" in got and p.num_refused() == 4) == ["good"]


def test_a_replayed_reservation_is_refused(sockets):
    """docs/design.md §8: the same reservation (same nonce) sent again is refused as replayed, even after the
    exchange it started is over."""
    p = sockets(listen="127.0.0.1:0")
    rogue = sockets(zmq.DEALER)
    rogue.connect(f"tcp://{p.address}")
    reservation = [header("reserve", "r0", "12" * 16)]
    rogue.send_multipart(reservation)
    assert _drain(reservation_ids(p), lambda got: got == ["r0"]) == ["r0"]
    p.forget("r0")   # P gave up on it (its request never came)
    rogue.send_multipart(reservation)
    assert _drain(reservation_ids(p), lambda _: p.num_refused("replayed") == 1) == []


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_thousand_prefill_addresses_do_not_exhaust_d(sockets):
    """docs/design.md §8: D reserving at 1100 distinct P addresses (nobody listens there) keeps at most
    `max_peers` (256) DEALERs open: while every kept one awaits an answer, a new address fails that reservation
    alone (an error delivered through `poll`, naming the limit), never the instance; once D gives up on them their
    DEALERs are closed for new ones, and a real P is reachable again."""
    d = sockets()
    before = _open_files()
    for i in range(1100):
        assert d.reserve(f"r{i}", f"127.0.0.1:{20000 + i}") is None   # posted: the outcome comes through poll
    failed = _drain(d.poll, lambda got: len(got) == 1100 - 256, attempts=2000)
    assert all(envelope.unsent and "distinct P addresses" in envelope.error for envelope in failed)
    assert _open_files() - before < 1024
    for i in range(1100):
        d.forget(f"r{i}")   # D gave up on them (their requests failed at their deadlines)
    p = sockets(listen="127.0.0.1:0")
    d.reserve("real", p.address)
    assert _drain(reservation_ids(p), lambda got: got == ["real"]) == ["real"]
    assert _open_files() - before < 1024


def test_a_handoff_header_nested_past_the_recursion_limit_is_a_receipt_rejection():
    """A hand-off whose header nests past Python's recursion limit is a PD_MTP_FLOW §5.2 step-1 rejection of
    its request, never an exception out of D's receipt."""
    deep = b'{"request_id":' + b"[" * 5000 + b"]" * 5000 + b"}"
    frames = [PREFIX.pack(MAGIC, PROTOCOL_VERSION, len(deep)) + deep]
    verdict = receive_handoff("r0", frames, config_hash="h", num_speculative_tokens=1)
    assert isinstance(verdict, Reject) and verdict.check is ReceiptCheck.INTEGRITY and "not valid JSON" in verdict.error
