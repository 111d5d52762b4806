"""One dead P stalls no one (SERVICES §6 "connector peer unreachable", design.md §8 "Floods"): requests naming P addresses where nothing listens take no slot of D's while their P has not completed a
connection, so a request paired with a live P is admitted and served meanwhile, however few slots D has; once the
reservation-ack deadline passes since a request first asked for a dead address, every request waiting for it fails
at once, naming the address, and D's slots and blocks are all free. D's admission scan reads its waiting queue
from the head only, so a step costs O(waiting) however many requests wait for a dead P. D's clock is a FakeClock:
only `advance` ends a deadline."""
from __future__ import annotations

import collections
import socket

from fastdeploy.entrypoints.pd_builder import build_engine, with_role
from fastdeploy.model_executor.models import get_model
from fastdeploy.schema.request import RequestStatus
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise import HandoffDeadlines
from fastdeploy.splitwise.zmq_transport import ZmqTransport
from tests.splitwise.fakes import FakeClock

from .harness import toy_config
from .test_pd_zmq_faults import BOUND_STEPS, Pair, assert_free

MODEL = get_model("fd-toy")
# D waits for a slot far longer than for a P's connection, so the failure is the connection's
DEADLINES = HandoffDeadlines(decode_allocation_s=60.0, kv_transfer_s=5.0, prefill_result_s=5.0, reservation_s=5.0,
                             reservation_ack_s=5.0)
PROMPT = MODEL.find_prompt(6, 9, seed=5)


def _dead_addresses(n: int) -> list[str]:
    """Loopback ports nothing listens on (bound, then released)."""
    probes = [socket.socket() for _ in range(n)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{probe.getsockname()[1]}" for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _decode(pair: Pair, max_num_seqs: int) -> FakeClock:
    """Replace the pair's D by one with `max_num_seqs` slots on a FakeClock."""
    pair.decode.close()
    pair.d_transport = ZmqTransport()
    clock = FakeClock()
    pair.decode = build_engine(with_role(toy_config(1, max_num_seqs=max_num_seqs), "decode"), MODEL,
                               pair.d_transport, clock=clock, deadlines=DEADLINES)
    return clock


def _poison(pair: Pair, addresses: list[str], n: int) -> list:
    return [pair.decode.add_request(f"dead-{i}", PROMPT, SamplingParams(max_tokens=4),
                                    disaggregate_info={"request_id": f"dead-{i}",
                                                       "prefill_addr": addresses[i % len(addresses)]})
            for i in range(n)]


def test_requests_for_dead_ps_hold_no_slot_and_fail_together_at_the_deadline():
    pair = Pair()
    try:
        clock = _decode(pair, max_num_seqs=2)
        dead = _dead_addresses(4)
        poisoned = _poison(pair, dead, 64)
        good = pair.add("good", PROMPT, max_tokens=4)
        pair.step_until(lambda: good.status is RequestStatus.FINISHED)
        assert good.finish_reason == "length" and good.error is None
        assert all(r.status is RequestStatus.WAITING for r in poisoned), "a request for a dead P holds a slot"
        clock.advance(DEADLINES.reservation_ack_s)
        pair.decode.step(max_wait_s=0.0)
        assert all(r.status is RequestStatus.FINISHED and r.finish_reason == "abort" for r in poisoned)
        assert all(f"no prefill instance completed a connection at {dead[i % len(dead)]} " in r.error
                   for i, r in enumerate(poisoned)), poisoned[0].error
        assert_free(pair.decode)
    finally:
        pair.close()


class _HeadOnly(collections.deque):
    """A deque that records the deepest position read or deleted by index (reaching position i costs O(i))."""

    deepest = 0

    def __getitem__(self, index):
        self.deepest = max(self.deepest, index if index >= 0 else len(self) + index)
        return super().__getitem__(index)

    def __delitem__(self, index):
        self.deepest = max(self.deepest, index if index >= 0 else len(self) + index)
        super().__delitem__(index)


def test_the_admission_scan_reads_the_waiting_queue_from_its_head():
    """With a thousand requests for a dead P and slots to spare, every step used to walk the
    waiting deque by index and delete from its middle (O(W²) a step); it reads only the head now, and the requests
    keep their order."""
    pair = Pair()
    try:
        _decode(pair, max_num_seqs=128)
        poisoned = _poison(pair, _dead_addresses(1), 1000)
        scheduler = pair.decode.scheduler
        scheduler.waiting = _HeadOnly(scheduler.waiting)
        for _ in range(3):
            pair.decode.step(max_wait_s=0.0)
        assert scheduler.waiting.deepest == 0
        assert [r.request_id for r in scheduler.waiting] == [r.request_id for r in poisoned]
    finally:
        pair.close()


def test_dead_addresses_push_out_no_live_ps_connection_and_are_dropped_at_their_deadline():
    """More distinct dead addresses than D keeps connections (`max_peers`): connecting to them closes no other
    connection, so the live P's stays ready and its requests are served; once their requests fail, D closes the
    connections to them."""
    pair = Pair()
    try:
        pair.decode.close()
        pair.d_transport = ZmqTransport(max_peers=4)
        clock = FakeClock()
        pair.decode = build_engine(with_role(toy_config(1), "decode"), MODEL, pair.d_transport, clock=clock,
                                   deadlines=DEADLINES)
        first = pair.add("first", PROMPT, max_tokens=4)
        pair.step_until(lambda: first.status is RequestStatus.FINISHED)
        poisoned = _poison(pair, _dead_addresses(8), 32)
        for _ in range(20):
            pair.decode.step(max_wait_s=0.005)
        assert pair.d_transport.peer_ready(pair.p_transport.address), "a dead address pushed out the live P"
        second = pair.add("second", PROMPT, max_tokens=4)
        pair.step_until(lambda: second.status is RequestStatus.FINISHED)
        assert (first.error, second.error) == (None, None)
        clock.advance(DEADLINES.reservation_ack_s)
        pair.decode.step(max_wait_s=0.0)
        assert all(r.status is RequestStatus.FINISHED for r in poisoned)
        for _ in range(BOUND_STEPS):   # the closes are posted to the transport's thread
            if len(pair.d_transport._dealers.sockets) == 1:
                break
            pair.decode.step(max_wait_s=0.005)
        assert list(pair.d_transport._dealers.sockets) == [pair.p_transport.address]
        assert_free(pair.decode)
    finally:
        pair.close()
