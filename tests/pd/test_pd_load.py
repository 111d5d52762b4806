"""PD under load (PD_MTP_FLOW §5.1; docs/benchmarks.md "PD under load"): with many more requests than D has slots, D's
reservations (blocks held for requests whose prompt P computes, or whose hand-off waits for a slot) never exceed
its slot count, so they cannot starve D's running requests of blocks: no slot is parked in a pool that holds every
slot at full length plus one reservation per slot, outputs equal the single instance's (O1, O2) and everything
drains (O3)."""
from __future__ import annotations

from fastdeploy.schema.sampling_params import SamplingParams
from tests.e2e.workloads import Case, run

from .harness import assert_same_as_single, drive, start_pd, submit
from .test_pd_scenarios import MODEL

K = 1
SLOTS = 4
MAX_MODEL_LEN = 64
BLOCK_SIZE = 4


def test_reservations_stay_within_the_slots_and_never_starve_decoding():
    cases = [Case(f"r{i}", MODEL.find_prompt(30, 6 + i % 5, seed=200 + i), SamplingParams(max_tokens=20))
             for i in range(32)]
    full_length = -(-(MAX_MODEL_LEN + 3 * K + 4) // BLOCK_SIZE)
    reservation = -(-(10 + 2 * K + 3) // BLOCK_SIZE)
    engine = dict(max_num_seqs=SLOTS, max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
                  num_kv_blocks=SLOTS * (full_length + reservation))
    pd = start_pd(K, **engine)
    held = []
    submit(pd, cases)
    while pd.engine.has_unfinished():
        pd.engine.step()
        scheduler = pd.engine.decode.scheduler
        held.append(len(scheduler.peer_waiting) + len(scheduler.prefilled) + len(scheduler.running))
        assert len(held) < 5000, "O3: the workload did not drain"
    drive(pd)
    assert max(held) <= SLOTS and max(held) > 0
    assert not pd.parked, f"D parked {sorted(pd.parked)}: reservations took its running requests' blocks"
    assert_same_as_single(cases, run(cases, K, **engine), pd.requests)
