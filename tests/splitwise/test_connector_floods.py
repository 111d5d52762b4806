"""Floods at the connector (docs/design.md §8, "Floods"): a peer that sends junk frames nonstop
to P's port, or a "P" that floods the D that reserved at it, cannot starve the I/O thread of the engine's posted
calls. While the flood runs (its refusals counted, so it demonstrably reached the same path), `forget` returns at
once, and a real reservation and its hand-off go through. With and without a secret (junk is refused before any
tag check, so the secret changes nothing; with one the flooder holds the secret's transport keys, since a stranger
delivers no frame at all: test_strangers.py)."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from fastdeploy.splitwise import Deadline, MonotonicClock
from fastdeploy.splitwise import zmq_routes
from fastdeploy.splitwise.zmq_transport import ZmqTransport

from .handoff_factory import make_message

CLOCK = MonotonicClock()
WAIT_S = 10.0
SECRETS = [None, b"flood-secret"]
FLOOD_FRAMES = 2000   # refusals seen before the good exchange starts: the flood is on


@pytest.fixture
def made():
    things = []
    yield things
    for thing in things:
        if isinstance(thing, subprocess.Popen):
            thing.kill()
            thing.wait(timeout=10)
        else:
            thing.close()


def _flooder(made: list, *args: str, secret: bytes | None = None) -> subprocess.Popen:
    """With `secret`, the flooder holds its transport keys (it gets past the handshake; its tags are unkeyed)."""
    env = {name: value for name, value in os.environ.items() if name != "FD_PD_SECRET"}
    if secret:
        env["FD_PD_SECRET"] = secret.decode()
    process = subprocess.Popen([sys.executable, "-m", "tests.splitwise.flooder", *args], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=env)   # it holds its connection until killed
    made.append(process)
    return process


def _until(condition, what: str, attempts: int = 3000) -> None:
    for _ in range(attempts):   # bounded: each try waits 10 ms at most
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"not reached: {what}")


def _exchange(p: ZmqTransport, d: ZmqTransport, rid: str) -> None:
    """A whole reservation -> hand-off -> ack round between a real D and a real P."""
    assert d.reserve(rid, p.address) is None
    assert p.poll_reservation_with_data(Deadline.after(CLOCK, WAIT_S)).request_id == rid
    p.send(rid, make_message(seed=3, request_id=rid).encode_frames())
    envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
    while envelope is not None and envelope.request_id != rid:   # the lure's failure (a keyed D refuses its P)
        envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
    assert envelope is not None and envelope.request_id == rid and envelope.error is None
    d.ack(rid)
    assert p.poll_ack(Deadline.after(CLOCK, WAIT_S)) == rid


@pytest.mark.parametrize("secret", SECRETS, ids=["no-secret", "secret"])
def test_junk_flooding_ps_port_does_not_starve_its_posted_calls(made, secret, caplog):
    caplog.set_level(logging.WARNING, logger="fastdeploy.splitwise.zmq_transport")
    p = ZmqTransport(listen="127.0.0.1:0", secret=secret)
    d = ZmqTransport(secret=secret)
    made += [p, d]
    flood = _flooder(made, "junk", p.address, secret=secret)
    _until(lambda: p.num_refused("malformed") >= FLOOD_FRAMES, "the flood reaches P")
    p.forget("nobody")   # a post: returns at once (it waited for the I/O thread, then raised, before)
    _exchange(p, d, "good")
    seen = p.num_refused("malformed")
    _until(lambda: p.num_refused("malformed") > seen, "the flood still runs after the exchange")
    assert flood.poll() is None
    # refusals are logged at most once a second per reason (each one was a WARNING line before)
    logged = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(logged) < 60 and p.num_refused("malformed") >= FLOOD_FRAMES


@pytest.mark.parametrize("secret", SECRETS, ids=["no-secret", "secret"])
def test_a_p_flooding_d_does_not_starve_ds_posted_calls(made, secret):
    p = ZmqTransport(listen="127.0.0.1:0", secret=secret)
    d = ZmqTransport(secret=secret)
    made += [p, d]
    fake = _flooder(made, "fake-p", "junk", secret=secret)
    fake_addr = fake.stdout.readline().strip()
    assert d.reserve("lure", fake_addr) is None
    _until(lambda: d.num_refused("malformed") >= FLOOD_FRAMES, "the flood reaches D")
    d.forget("lure")
    _exchange(p, d, "good")   # D's reservation and ack to the real P are posts the flood does not hold up
    seen = d.num_refused("malformed")
    _until(lambda: d.num_refused("malformed") > seen, "the flood still runs after the exchange")
    assert fake.poll() is None


def test_reservations_past_the_route_table_are_refused_and_a_routes_handoff_still_goes(made, monkeypatch):
    """The route table is full (65536 routes; 100 here, the same path) of unauthenticated
    reservations: P refuses the new ones as `full` instead of evicting the oldest, so the route of a real D's
    reservation, made first, still carries its hand-off."""
    monkeypatch.setattr(zmq_routes, "MAX_ROUTES", 100)
    p, d = ZmqTransport(listen="127.0.0.1:0"), ZmqTransport()
    made += [p, d]
    assert d.reserve("victim", p.address) is None
    assert p.poll_reservation_with_data(Deadline.after(CLOCK, WAIT_S)).request_id == "victim"
    flood = _flooder(made, "reserve", p.address, "200", "0")
    assert flood.stdout.readline().strip() == "done"
    taken = []
    _until(lambda: taken.extend(iter(lambda: p.poll_reservation_with_data(), None)) or
           len(taken) + p.refused_counts().get("full", 0) == 200, "every flood reservation taken or refused")
    p.send("victim", make_message(seed=3, request_id="victim").encode_frames())
    envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
    assert envelope is not None and envelope.request_id == "victim" and envelope.error is None
    assert len(taken) == 99 and p.num_refused("full") == 101


@pytest.mark.parametrize("cap, value, count, nbytes", [("MAX_ROUTES_PER_PEER", 30, 60, 0),
                                                       ("MAX_HELD_BYTES_PER_PEER", 4 << 20, 24, 512 << 10)],
                         ids=["count", "bytes"])
def test_ps_reservations_of_one_d_are_capped_in_count_and_bytes(made, monkeypatch, cap, value, count, nbytes):
    """P holds at most so many unmatched reservations of one D, and so many bytes of their data (4096 and 64 MiB;
    smaller here, the same path); past a cap each is refused as `full`, and what is held is the JSON as it came
    (a decoded object took ~5x its size)."""
    monkeypatch.setattr(zmq_routes, cap, value)
    p = ZmqTransport(listen="127.0.0.1:0")
    made.append(p)
    flood = _flooder(made, "reserve", p.address, str(count), str(nbytes))
    assert flood.stdout.readline().strip() == "done"
    taken = []
    _until(lambda: taken.extend(iter(lambda: p.poll_reservation_with_data(), None)) or
           len(taken) + p.refused_counts().get("full", 0) == count, "every flood reservation taken or refused")
    assert len(taken) * max(nbytes, 1) <= value and p.refused_counts().get("full", 0) >= count // 2
    assert all(isinstance(r.encoded, bytes) for r in taken if nbytes)


def test_d_drops_a_p_that_sends_a_frame_past_its_limit_before_buffering_it(made):
    """ZMQ_MAXMSGSIZE on D's DEALERs, from --max-model-len (here 4096: about 1.1 MiB a frame): a "P" a client
    names that answers with a 16 MiB frame has its connection dropped by libzmq before the frame is buffered,
    so nothing of it reaches D (it buffered the whole frame, then refused it, before)."""
    d = ZmqTransport(max_model_len=4096)
    made.append(d)
    assert d.max_frame_bytes < 2 << 20
    fake = _flooder(made, "fake-p", "big", str(16 << 20))
    assert d.reserve("r0", fake.stdout.readline().strip()) is None
    assert fake.stdout.readline().strip() == "disconnected"
    envelope = d.poll()
    assert envelope is None or envelope.error is not None


def test_a_dealer_holding_only_abandoned_reservations_is_reopened(made, caplog):
    """D's queue to a P that never answered is full of reservations whose requests D gave up on: the next one to
    that address closes the socket (dropping them) and goes out on a fresh one, so that P address is usable again
    (it was full for good before); a P that comes up there afterwards gets only the live reservation. (`reserve`
    is a post: P starts only once D's I/O thread has reopened. Started earlier, as when that thread is slow on a
    loaded machine, P is found by the old socket's reconnect, which delivers the abandoned ones first: a failure
    seen under `-n 2`.)"""
    caplog.set_level(logging.WARNING, logger="fastdeploy.splitwise.zmq_transport")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{probe.getsockname()[1]}"
    d = ZmqTransport(capacity=2)
    made.append(d)
    for rid in ("a", "b"):
        assert d.reserve(rid, addr) is None
    assert d.reserve("c", addr) is not None   # two await an answer there: refused as a value
    for rid in ("a", "b"):
        d.forget(rid)
    assert d.reserve("c", addr) is None
    _until(lambda: any("reopened" in r.getMessage() for r in caplog.records), "D reopens its queue to that P")
    p = ZmqTransport(listen=addr)
    made.append(p)
    reservation = p.poll_reservation_with_data(Deadline.after(CLOCK, WAIT_S))
    assert reservation is not None and reservation.request_id == "c"
    assert p.poll_reservation_with_data(Deadline.after(CLOCK, 0.5)) is None   # a and b were dropped with the socket
