"""Strangers deliver no frames (SERVICES §7 "Who may deliver frames"): with a PD secret, a
peer that does not hold it cannot complete the connector's handshake (peer_auth.py), so an unfinished multipart
message it sends — which libzmq would otherwise keep whole until its last frame, whatever `ZMQ_MAXMSGSIZE` says of
each frame — costs the receiver no memory. At P (several stranger D connections to its port) and at D (a stranger
P that a client named in `prefill_addr`). Each stranger sends SENT_BYTES; the receiver's resident memory must grow
by less than RSS_BOUND while the strangers' connections are still open (before this fix it grew by about what was
sent), and the receiver keeps serving its true peers."""
from __future__ import annotations

import os
import threading

import pytest

from fastdeploy.splitwise import Deadline, MonotonicClock
from fastdeploy.splitwise.peer_auth import CurveKeys
from fastdeploy.splitwise.zmq_transport import ZmqTransport

from .fakes import reservation_ids
from .handoff_factory import make_message
from .zmtp_stranger import FakeP, flood, open_to

CLOCK = MonotonicClock()
WAIT_S = 30.0
SECRET = b"strangers-secret"
SENT_BYTES = 96 << 20     # per stranger connection
STRANGERS_AT_P = 2
RSS_BOUND = 48 << 20      # generous: a connection's handshake state is a few KiB, the test's own noise a few MiB


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def made():
    things = []
    yield things
    for thing in things:
        thing.close()


def _exchange(p: ZmqTransport, d: ZmqTransport, rid: str) -> None:
    """A whole reservation -> hand-off -> ack round between a true D and a true P."""
    assert d.reserve(rid, p.address) is None
    assert p.poll_reservation_with_data(Deadline.after(CLOCK, WAIT_S)).request_id == rid
    p.send(rid, make_message(seed=3, request_id=rid).encode_frames())
    envelope = d.poll(Deadline.after(CLOCK, WAIT_S))
    assert envelope is not None and envelope.request_id == rid and envelope.error is None
    d.ack(rid)
    assert p.poll_ack(Deadline.after(CLOCK, WAIT_S)) == rid


def test_strangers_unfinished_messages_cost_p_no_memory(made):
    p = ZmqTransport(listen="127.0.0.1:0", secret=SECRET)
    made.append(p)
    before = _rss()
    connections = [open_to(p.address) for _ in range(STRANGERS_AT_P)]
    made.extend(connections)
    for connection in connections:   # held open: what P took in would stay until they close
        flood(connection, b"DEALER", SENT_BYTES)
    grown = _rss() - before
    assert grown < RSS_BOUND, f"P's resident memory grew by {grown >> 20} MiB while strangers held their messages"
    assert p.num_refused() == 0   # nothing was delivered to be refused
    d = ZmqTransport(secret=SECRET)
    made.append(d)
    _exchange(p, d, "good")


def test_a_stranger_p_named_by_a_client_costs_d_no_memory(made):
    d = ZmqTransport(secret=SECRET)
    fake = FakeP()
    made += [d, fake]
    before = _rss()
    flooded = []
    flooder = threading.Thread(target=lambda: flooded.append(fake.flood_first_d(SENT_BYTES)), daemon=True)
    flooder.start()
    assert d.reserve("poisoned", fake.address) is None   # D connects to the address a client named
    flooder.join(WAIT_S)
    assert flooded, "the fake P never saw D connect"
    grown = _rss() - before
    assert grown < RSS_BOUND, f"D's resident memory grew by {grown >> 20} MiB from a stranger P's message"
    assert not d.peer_ready(fake.address)
    p = ZmqTransport(listen="127.0.0.1:0", secret=SECRET)
    made.append(p)
    _exchange(p, d, "good")


def test_the_transport_keys_come_from_the_secret_alone():
    """P and D need nothing but the secret to pair: the same secret gives the same keypairs, another secret other
    ones, and the server's and the clients' keypairs differ (each its own derive-key context)."""
    keys = CurveKeys.from_secret(SECRET)
    assert keys == CurveKeys.from_secret(SECRET)
    other = CurveKeys.from_secret(SECRET + b"!")
    assert {keys.server_public, keys.client_public}.isdisjoint({other.server_public, other.client_public})
    assert keys.server_public != keys.client_public and len(keys.server_secret) == 40   # Z85 of 32 bytes
