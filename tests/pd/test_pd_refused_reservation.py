"""A reservation the transport refuses (the peer's queue is full) under load: D gives the slot and blocks it took
for the request back and retries in a later step, so every request still completes as on a single instance and
D's free slots and blocks return to their totals (PD_MTP_FLOW §5.1, SERVICES §6 step 2). Checked through the
engines' public stats."""
from __future__ import annotations

from tests.e2e.workloads import run

from .harness import assert_drained, assert_same_as_single, drive, start_pd, submit
from .test_pd_scenarios import eos_case

K = 1
SLOTS = 4


def refuse_every_other_reservation(transport) -> list[str]:
    """Make `transport.reserve` refuse every second call (its return value says why); returns the refused request
    ids."""
    original, calls, refused = transport.reserve, [], []

    def reserve(request_id, *args, **kwargs):
        calls.append(request_id)
        if len(calls) % 2:
            refused.append(request_id)
            return f"test: the reservation queue is full; request {request_id} was not sent"
        return original(request_id, *args, **kwargs)

    transport.reserve = reserve
    return refused


def test_refused_reservations_under_load_give_back_ds_slot_and_blocks():
    workload = [eos_case(f"r{i}", 3 + i % 5, seed=120 + i) for i in range(3 * SLOTS)]
    pd = start_pd(K, max_num_seqs=SLOTS)
    refused = refuse_every_other_reservation(pd.engine.transport)
    submit(pd, workload)
    drive(pd)      # O3 watchdog: fails, never hangs, if lost slots leave requests waiting
    assert len(refused) >= SLOTS, "the transport refused too few reservations to test anything"
    assert_drained(pd)
    stats = pd.engine.decode.stats()
    assert (stats.free_slots, stats.free_kv_blocks) == (stats.total_slots, stats.total_kv_blocks)
    assert_same_as_single(workload, run(workload, K, max_num_seqs=SLOTS), pd.requests)
