"""The ZeroMQ connector's receive-side bound (docs/design.md §8 "Bounds"): P takes reservations off its socket only
while its inbound queue is below `queue_capacity`; the rest wait in the socket, none is dropped and they come out
in order."""
from __future__ import annotations

import time

import pytest

from fastdeploy.splitwise import Deadline, MonotonicClock
from fastdeploy.splitwise.zmq_transport import ZmqTransport
from .fakes import reservation_ids

CAPACITY = 3
RESERVATIONS = 24
WAIT_S = 10.0   # bounds each poll; never an assertion on time


@pytest.fixture
def pair():
    prefill = ZmqTransport(listen="127.0.0.1:0", queue_capacity=CAPACITY)
    decode = ZmqTransport()
    try:
        yield prefill, decode
    finally:
        decode.close()
        prefill.close()


def test_prefill_inbound_reservation_queue_never_exceeds_its_capacity(pair):
    prefill, decode = pair
    ids = [f"r{i:02d}" for i in range(RESERVATIONS)]
    for rid in ids:
        decode.reserve(rid, prefill.address)
    time.sleep(0.2)   # let every reservation reach P's socket, so that an unbounded drain would take them all
    clock = MonotonicClock()
    got, most_queued = [], 0
    while len(got) < RESERVATIONS:
        rid = reservation_ids(prefill)(Deadline.after(clock, WAIT_S))
        assert rid is not None, f"reservation {len(got)} never came"
        got.append(rid)
        # white-box: the deque the bound protects (the socket holds the rest)
        most_queued = max(most_queued, len(prefill._reservations) + 1)
    assert got == ids
    assert most_queued <= CAPACITY, f"P queued {most_queued} reservations, its bound is {CAPACITY}"
