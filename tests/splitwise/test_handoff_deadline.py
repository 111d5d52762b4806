"""Deadlines of the cross-instance waits (PD_MTP_FLOW §3 "Every wait ... has a deadline", I10), on a fake clock."""

from __future__ import annotations

import pytest

from fastdeploy.splitwise import (
    Deadline,
    HandoffDeadlines,
    PendingWaits,
    WaitKind,
)
from tests.splitwise.fakes import FakeClock


def test_deadline_expires_exactly_at_its_time():
    """A deadline is met strictly before `expires_at` and expired from it on; remaining time never goes negative."""
    clock = FakeClock(start_s=100.0)
    deadline = Deadline.after(clock, 5.0)
    assert not deadline.is_expired() and deadline.remaining_s() == 5.0
    clock.advance(4.5)
    assert not deadline.is_expired() and deadline.remaining_s() == 0.5
    clock.advance(0.5)
    assert deadline.is_expired() and deadline.remaining_s() == 0.0
    clock.advance(10.0)
    assert deadline.remaining_s() == 0.0


def test_each_wait_kind_uses_its_own_timeout():
    """PD_MTP_FLOW §3: decode allocation, KV transfer and prefill result each have a configured deadline."""
    clock = FakeClock()
    deadlines = HandoffDeadlines(decode_allocation_s=1.0, kv_transfer_s=2.0, prefill_result_s=3.0)
    waits = PendingWaits(clock, deadlines)
    waits.start("alloc", WaitKind.DECODE_ALLOCATION)
    waits.start("xfer", WaitKind.KV_TRANSFER)
    waits.start("result", WaitKind.PREFILL_RESULT)
    expired_at = {}
    for _ in range(4):
        clock.advance(1.0)
        for wait in waits.pop_expired():
            expired_at[wait.request_id] = (clock.now(), wait.kind)
    assert expired_at == {"alloc": (1.0, WaitKind.DECODE_ALLOCATION), "xfer": (2.0, WaitKind.KV_TRANSFER),
                          "result": (3.0, WaitKind.PREFILL_RESULT)}
    assert len(waits) == 0


def test_finished_wait_never_expires():
    """I10 reclaim path runs only for waits still pending: finishing one removes it for good."""
    clock = FakeClock()
    waits = PendingWaits(clock, HandoffDeadlines())
    waits.start("r1", WaitKind.PREFILL_RESULT)
    assert "r1" in waits
    assert waits.finish("r1") is WaitKind.PREFILL_RESULT
    clock.advance(10_000.0)
    assert waits.pop_expired() == [] and "r1" not in waits
    assert waits.finish("r1") is None


def test_expired_wait_is_reported_once_with_a_clear_error():
    """An expired wait is popped exactly once, with an error naming the request, the wait and the timeout."""
    clock = FakeClock()
    waits = PendingWaits(clock, HandoffDeadlines(prefill_result_s=300.0))
    waits.start("req-3", WaitKind.PREFILL_RESULT)
    clock.advance(300.0)
    (expired,) = waits.pop_expired()
    assert expired.error == "PD: request req-3: prefill result did not complete within 300 s"
    assert waits.pop_expired() == []
    assert waits.finish("req-3") is None  # a late hand-off for it finds no wait: D drops it (and acks)


def test_one_wait_per_request():
    """A request waits for one thing at a time; a second start is a caller bug reported with both names."""
    waits = PendingWaits(FakeClock(), HandoffDeadlines())
    waits.start("r1", WaitKind.DECODE_ALLOCATION)
    with pytest.raises(ValueError, match="request r1 already waits for decode allocation"):
        waits.start("r1", WaitKind.PREFILL_RESULT)


@pytest.mark.parametrize("field", ["decode_allocation_s", "kv_transfer_s", "prefill_result_s", "min_transfer_mbps"])
@pytest.mark.parametrize("value", [0, -1.0, True, "5"])
def test_deadline_config_rejects_non_positive_values(field, value):
    """Every wait must be bounded: zero, negative or non-numeric timeouts are refused, naming the field."""
    with pytest.raises(ValueError, match=f"HandoffDeadlines: field '{field}' must be a number > 0"):
        HandoffDeadlines(**{field: value})


def test_the_waits_the_kv_moves_in_scale_with_its_bytes():
    """SERVICES §6 "a slow link": the prefill result and KV transfer deadlines are the timeout plus the time the
    hand-off's KV takes at the floor rate (here 10 MB at 8 Mbit/s: 10 s more); the other waits ignore the bytes."""
    clock = FakeClock()
    deadlines = HandoffDeadlines(kv_transfer_s=2.0, prefill_result_s=3.0, decode_allocation_s=1.0,
                                 min_transfer_mbps=8.0)
    assert deadlines.transfer_allowance_s(10_000_000) == pytest.approx(10.0)
    waits = PendingWaits(clock, deadlines)
    waits.start("xfer", WaitKind.KV_TRANSFER, 10_000_000)
    waits.start("result", WaitKind.PREFILL_RESULT, 10_000_000)
    waits.start("alloc", WaitKind.DECODE_ALLOCATION, 10_000_000)
    waits.start("small", WaitKind.KV_TRANSFER, 0)
    expired_at = {}
    for _ in range(14):
        clock.advance(1.0)
        expired_at.update({wait.request_id: (clock.now(), wait) for wait in waits.pop_expired()})
    assert {rid: at for rid, (at, _) in expired_at.items()} == {"alloc": 1.0, "small": 2.0, "xfer": 12.0,
                                                                 "result": 13.0}
    assert expired_at["result"][1].error == ("PD: request result: prefill result did not complete within 3 s + 10 s "
                                             "for its 10000000 bytes of KV at the 8 Mbit/s floor "
                                             "(--pd-min-transfer-mbps)")
    assert expired_at["alloc"][1].error == "PD: request alloc: decode allocation did not complete within 1 s"
