"""In-process P→D transport: bounded, lossless unless a fault is injected, deadline-driven (PD_MTP_FLOW I10)."""

from __future__ import annotations

import threading
import time

import pytest

from fastdeploy.splitwise import (
    Deadline,
    FinishAtReceipt,
    HandoffDeadlines,
    Insert,
    MonotonicClock,
    PendingWaits,
    ReceiptCheck,
    Reject,
    TransportFullError,
    WaitKind,
    receive_handoff,
)
from tests.splitwise.fakes import FakeClock, Fault, FaultyTransport

from .handoff_factory import KV_LAYOUT, MTP_CONFIG_HASH, make_message


def _receive(envelope):
    return receive_handoff(envelope.request_id, envelope.payload, config_hash=MTP_CONFIG_HASH,
                           num_speculative_tokens=1, kv_layout=KV_LAYOUT)


def test_handoffs_and_acks_travel_in_order():
    """D receives hand-offs in send order, byte for byte; P receives D's acks in ack order."""
    transport = FaultyTransport(capacity=4, clock=FakeClock())
    payloads = {f"r{i}": make_message(seed=i, request_id=f"r{i}").encode() for i in range(3)}
    for rid, payload in payloads.items():
        transport.send(rid, payload)
    received = [transport.poll() for _ in range(3)]
    assert [(e.request_id, e.payload) for e in received] == list(payloads.items())
    assert transport.poll() is None
    for rid in ("r1", "r0"):
        transport.ack(rid)
    assert [transport.poll_ack(), transport.poll_ack(), transport.poll_ack()] == ["r1", "r0", None]


def test_full_queue_is_an_error_and_loses_nothing():
    """A full queue raises at the sender, naming the request; nothing is dropped or overwritten."""
    transport = FaultyTransport(capacity=2, clock=FakeClock())
    transport.send("r0", b"m0")
    transport.send("r1", b"m1")
    with pytest.raises(TransportFullError, match="hand-off queue is full .*request r2 was not sent"):
        transport.send("r2", b"m2")
    assert transport.num_in_flight() == 2
    assert transport.poll().payload == b"m0"
    transport.send("r2", b"m2")
    assert [transport.poll().payload, transport.poll().payload] == [b"m1", b"m2"]
    assert transport.num_dropped == 0


def test_full_ack_queue_is_an_error():
    """Acks are bounded too; overflowing them is reported, never silently discarded."""
    transport = FaultyTransport(ack_capacity=1, clock=FakeClock())
    transport.ack("r0")
    with pytest.raises(TransportFullError, match="acknowledgement queue is full .*request r1"):
        transport.ack("r1")
    assert transport.num_pending_acks() == 1


def test_dropped_handoff_expires_the_prefill_result_deadline():
    """I10 "drop P's result": D's poll gives up exactly at the deadline and the wait expires with an error."""
    clock = FakeClock()
    transport = FaultyTransport(clock=clock)
    d_waits = PendingWaits(clock, HandoffDeadlines(prefill_result_s=300.0))
    d_waits.start("r0", WaitKind.PREFILL_RESULT)
    transport.inject_fault(Fault.DROP, request_id="r0")
    transport.send("r0", make_message(request_id="r0").encode())
    assert transport.num_dropped == 1 and transport.num_in_flight() == 0
    assert transport.poll(Deadline.after(clock, 300.0)) is None
    assert clock.now() == 300.0
    (expired,) = d_waits.pop_expired()
    assert expired.request_id == "r0" and "prefill result did not complete within 300 s" in expired.error


def test_handoff_stalled_past_the_deadline_is_not_delivered_in_time():
    """I10 "stall the transfer": a hand-off visible only after the deadline is not returned before it."""
    clock = FakeClock()
    transport = FaultyTransport(clock=clock)
    transport.inject_fault(Fault.STALL, stall_s=50.0)
    transport.send("r0", b"late")
    assert transport.poll(Deadline.after(clock, 10.0)) is None
    assert clock.now() == 10.0
    clock.advance(40.0)
    assert transport.poll().payload == b"late"  # it does arrive, after the wait was given up


def test_stall_within_the_deadline_is_waited_for():
    """A poll with a deadline wakes as soon as a stalled hand-off becomes visible, not at the deadline."""
    clock = FakeClock()
    transport = FaultyTransport(clock=clock)
    transport.inject_fault(Fault.STALL, stall_s=3.0)
    transport.send("r0", b"m0")
    assert transport.poll(Deadline.after(clock, 10.0)).payload == b"m0"
    assert clock.now() == 3.0


def test_stalled_handoff_does_not_hold_back_later_ones():
    """One slow transfer must not block other requests' hand-offs."""
    clock = FakeClock()
    transport = FaultyTransport(clock=clock)
    transport.inject_fault(Fault.STALL, request_id="slow", stall_s=5.0)
    transport.send("slow", b"s")
    transport.send("fast", b"f")
    assert transport.poll().request_id == "fast"
    assert transport.poll() is None
    clock.advance(5.0)
    assert transport.poll().request_id == "slow"


def test_corrupted_bytes_fail_the_request_on_receipt():
    """PD_MTP_FLOW §5.2 step 1 through the transport: a flipped bit in the KV bytes is caught by the integrity tag."""
    transport = FaultyTransport(clock=FakeClock())
    transport.inject_fault(Fault.CORRUPT)
    transport.send("r0", make_message(request_id="r0").encode())
    verdict = _receive(transport.poll())
    assert isinstance(verdict, Reject) and verdict.check is ReceiptCheck.INTEGRITY
    assert "integrity tag" in verdict.error


def test_handoff_with_one_draft_id_is_rejected_with_the_spec_error():
    """O4 last row: under MTP, [t0] alone (t0 not terminating) fails that request with the PD_MTP_FLOW §5.2 step 3
    text."""
    transport = FaultyTransport(clock=FakeClock())
    transport.inject_fault(Fault.ONE_DRAFT_ID, request_id="r1")
    for rid in ("r0", "r1"):
        transport.send(rid, make_message(request_id=rid).encode())
    first, second = _receive(transport.poll()), _receive(transport.poll())
    assert isinstance(first, Insert)  # the fault hit only r1
    assert isinstance(second, Reject) and second.check is ReceiptCheck.DRAFT_IDS
    assert second.error == ("PD+MTP: request r1 arrived from P with 1 draft id; "
                            "2 are required (first token + one MTP draft)")


def test_one_draft_id_fault_on_a_terminating_t0_still_finishes_at_receipt():
    """PD_MTP_FLOW §5.2 order: a t0 that terminates the request wins over a missing draft."""
    transport = FaultyTransport(clock=FakeClock())
    transport.inject_fault(Fault.ONE_DRAFT_ID)
    transport.send("r0", make_message(request_id="r0", t0=0).encode())
    verdict = _receive(transport.poll())
    assert isinstance(verdict, FinishAtReceipt) and verdict.finish_reason == "stop"


def test_missing_ack_expires_the_kv_transfer_deadline():
    """I10: P waits for D's ack at most kv_transfer_s, then reclaims its blocks."""
    clock = FakeClock()
    transport = FaultyTransport(clock=clock)
    p_waits = PendingWaits(clock, HandoffDeadlines(kv_transfer_s=60.0))
    transport.send("r0", b"m0")
    deadline = p_waits.start("r0", WaitKind.KV_TRANSFER)
    assert transport.poll_ack(deadline) is None and clock.now() == 60.0
    (expired,) = p_waits.pop_expired()
    assert expired.kind is WaitKind.KV_TRANSFER


def test_fault_arguments_are_validated():
    """A stall needs a positive duration; faults must be Fault members."""
    transport = FaultyTransport(clock=FakeClock())
    with pytest.raises(ValueError, match="'stall_s' must be > 0"):
        transport.inject_fault(Fault.STALL)
    with pytest.raises(ValueError, match="'fault' must be a Fault"):
        transport.inject_fault("drop")
    with pytest.raises(ValueError, match="'capacity' must be an int >= 1"):
        FaultyTransport(capacity=0)


def test_concurrent_senders_and_receiver_lose_nothing():
    """Thread safety: two P threads against one D thread through a 3-slot queue; every hand-off arrives once.

    Senders retry on TransportFullError (the caller's choice the error leaves open). No timing is asserted;
    the deadlines only bound the test if a message were lost.
    """
    clock = MonotonicClock()
    transport = FaultyTransport(capacity=3, clock=clock)
    sent = [[f"p{p}-{i}" for i in range(150)] for p in range(2)]
    received: list[str] = []

    def produce(ids):
        for rid in ids:
            while True:
                try:
                    transport.send(rid, rid.encode())
                    break
                except TransportFullError:
                    time.sleep(0.0005)

    def consume():
        while len(received) < 300:
            envelope = transport.poll(Deadline.after(clock, 30.0))
            if envelope is None:
                return
            assert envelope.payload == envelope.request_id.encode()
            received.append(envelope.request_id)
            transport.ack(envelope.request_id)

    threads = [threading.Thread(target=produce, args=(ids,)) for ids in sent] + [threading.Thread(target=consume)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(received) == sorted(sent[0] + sent[1])
    for ids in sent:  # per sender, FIFO
        assert [r for r in received if r in set(ids)] == ids
    acks = []
    while (rid := transport.poll_ack()) is not None:
        acks.append(rid)
    assert acks == received
