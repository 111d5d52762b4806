"""A reader waiting on the ZeroMQ connector is woken by what its I/O thread takes in ("Defects the suite
would not notice", 3): P waiting for a reservation and D waiting for a hand-off each get theirs while their wait
still has time left, not once its bound has run out. A mailbox that stops notifying its readers passes every
other test, only slowly: each message then waits out its reader's whole bound.

The check is relative to the bound, not a wall-clock budget: the reader's deadline must still have time left when
the message is taken; the bound is long enough that only a reader that was never woken can reach it.
"""
from __future__ import annotations

import threading
import time

from fastdeploy.splitwise import Deadline, MonotonicClock
from fastdeploy.splitwise.zmq_transport import ZmqTransport

from .handoff_factory import make_message

CLOCK = MonotonicClock()
POLL_BOUND_S = 20.0   # the reader's wait; reached only by a reader the mailbox never woke
SETTLE_S = 0.2        # lets the reader enter its wait before the message is sent (not asserted on)


def _wait_in_thread(poll) -> tuple[threading.Thread, dict]:
    """Runs `poll(deadline)` in a thread; the result is the item and the deadline's time left when it returned."""
    result: dict = {}
    deadline = Deadline.after(CLOCK, POLL_BOUND_S)

    def wait():
        result["item"] = poll(deadline)
        result["left_s"] = deadline.remaining_s()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    time.sleep(SETTLE_S)
    return thread, result


def test_a_waiting_reader_takes_a_message_before_its_wait_runs_out():
    p, d = ZmqTransport(listen="127.0.0.1:0"), ZmqTransport()
    try:
        waiter, on_p = _wait_in_thread(p.poll_reservation)
        d.reserve("r0", p.address)
        waiter.join(POLL_BOUND_S + 10)
        assert on_p["item"] == "r0" and on_p["left_s"] > 0, on_p

        waiter, on_d = _wait_in_thread(d.poll)
        p.send("r0", make_message(seed=0, request_id="r0").encode_frames())
        waiter.join(POLL_BOUND_S + 10)
        assert on_d["item"] is not None and on_d["item"].request_id == "r0" and on_d["left_s"] > 0, on_d
    finally:
        d.close()
        p.close()
