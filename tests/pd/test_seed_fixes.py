"""Regression tests of the four parts of the PD + MTP fix (PD_MTP_FLOW §8, FastDeploy PR #6495). Each test fails
when its fix is reverted; the hang of fix (2) is caught by the I1 trace check or the O3 watchdog (bounded steps),
never by waiting."""
from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.model_executor.ops import state_ops as ops
from tests.e2e.workloads import Case, run
from tests.engine.helpers import StepOutputs, add_request, make_config, make_engine_parts, runner_output
from tests.reference.speculate_update import speculate_update as reference_speculate_update

from .harness import assert_same_as_single, drive, run_pd, start_pd, submit, workload
from .test_pd_scenarios import MODEL, eos_case


def test_fix1_a_count_of_one_is_processed_whatever_the_token_value():
    """Fix (1), PD_MTP_FLOW §6 / I5: D's first-round entry [0] — token id 0 is one of the request's stop_token_ids —
    finishes the request and frees its slot; the pre-fix rule skipped any entry whose last token was <= 0, so the
    request would never finish."""
    scheduler, resources = make_engine_parts(make_config(k=1))
    request = add_request(scheduler, "0", max_tokens=8)
    request.eos_token_ids = (*request.eos_token_ids, 0)
    scheduler.schedule()
    finished = StepOutputs(scheduler, resources).apply(runner_output([[0], [], [], []], width=2,
                                                                     draft_counts=[1, -1, -1, -1]))
    assert finished == [request] and request.output_token_ids == [0] and request.finish_reason == "stop"
    assert request.slot is None and resources.owner(0) is None


def eos_in_first_round_cases(agreement: float) -> list[Case]:
    """D's first round verifies [t0, d1]. With every draft rejected (agreement 0) an EOS at output index 1 is the
    corrected token; with every draft accepted (agreement 1) it is d1 itself (index 1) or the bonus token
    (index 2)."""
    indices = (1, 1) if agreement == 0.0 else (1, 2)
    return [eos_case(f"eos_{i}", i, seed=101 + j) for j, i in enumerate(indices)]


@pytest.mark.parametrize("backend", ["cpu", pytest.param("xpu3-emulator", marks=pytest.mark.emulator)])
def test_fix2_eos_in_d_first_round_is_released_in_the_same_step(backend):
    """Fix (2), OPS §5.1 row C / I2: speculate_update adds accept_num to seq_lens_decoder of a slot verify just
    stopped, so save_output reports the EOS of D's first round (dec = L + n >= L + 1 = prompt_lens) and the
    engine frees the slot in that step (I1). Without it the EOS is hidden and the request hangs (PD_MTP_FLOW §8)."""
    for agreement in (0.0, 1.0):
        pd = run_pd(eos_in_first_round_cases(agreement), 1, ops_backend=backend,
                    model_options={"mtp_agreement": agreement})
        for request in pd.requests:
            assert request.output_token_ids[-1] == MODEL.eos_token_ids[0]
            assert request.metrics.num_decode_rounds == 1
        assert pd.decode_trace.releases_checked >= 2


def speculate_update_without_row_c(*tensors) -> None:
    """The NumPy reference of speculate_update with the pre-fix rule: a stopped slot does not add accept_num."""
    arrays = [np.from_dlpack(t) for t in tensors]
    seq_lens_decoder, accept_num, stop_flags, is_block_step = arrays[1], arrays[6], arrays[7], arrays[9]
    reference_speculate_update(*arrays)
    row_c = stop_flags & ~is_block_step
    seq_lens_decoder[row_c] -= accept_num[row_c]


def test_fix2_reverted_is_caught_within_a_bounded_number_of_steps(monkeypatch):
    """The test above detects the hang: with row C's increment omitted (the pre-fix op, as a NumPy variant), the
    same run fails on the I1 check or the O3 watchdog after a bounded number of steps."""
    monkeypatch.setattr(ops, "speculate_update", speculate_update_without_row_c)
    pd = start_pd(1, model_options={"mtp_agreement": 0.0})
    submit(pd, eos_in_first_round_cases(0.0))
    with pytest.raises(AssertionError, match="I1|O3"):
        drive(pd)


@pytest.mark.parametrize("k", [1, 2])
def test_fix3_d_first_round_covers_two_positions(k):
    """Fix (3), PD_MTP_FLOW §5.3 / I3: D inserts seq_lens_this_time = 2, so d1 is verified in D's first round and the
    per-round acceptance equals the single instance's exactly (O2); with one position d1 is never verified."""
    cases = workload(11)[:24]
    single = run(cases, k)
    pd = start_pd(k)
    runner, widths = pd.engine.decode.runner, []
    insert = runner.insert_tasks

    def insert_and_record(plan):
        insert(plan)
        widths.extend(int(runner.state.seq_lens_this_time[task.slot]) for task in plan.decode_tasks)

    runner.insert_tasks = insert_and_record
    submit(pd, cases)
    drive(pd)
    assert_same_as_single(cases, single, pd.requests)
    assert widths and set(widths) == {2}


def test_fix4_d_first_round_drafts_come_from_the_request():
    """Fix (4), PD_MTP_FLOW §5.3: draft_tokens[b, 0:2] = [t0, d1] from the hand-off, not what the slot's previous
    occupant left there. Two slots serve many requests in turn, so every insertion lands on stale drafts; outputs must
    still equal the single instance's (O1) and acceptance too (O2)."""
    cases = [eos_case(f"r{i}", 3 + i % 5, seed=110 + i) for i in range(10)]
    single = run(cases, 1)
    pd = start_pd(1, max_num_seqs=2)
    runner, inserted = pd.engine.decode.runner, []
    insert = runner.insert_tasks

    def insert_and_record(plan):
        stale = {task.slot: tuple(int(t) for t in runner.state.draft_tokens[task.slot, :2])
                 for task in plan.decode_tasks}
        insert(plan)
        inserted.extend((task.draft_token_ids, stale[task.slot],
                         tuple(int(t) for t in runner.state.draft_tokens[task.slot, :2])) for task in plan.decode_tasks)

    runner.insert_tasks = insert_and_record
    submit(pd, cases)
    drive(pd)
    assert_same_as_single(cases, single, pd.requests)
    assert len(inserted) == len(cases)
    assert all(written == drafts for drafts, _, written in inserted)
    # Guard: most insertions landed on a slot whose previous drafts differ, so keeping them would be wrong.
    assert sum(stale != drafts for drafts, stale, _ in inserted) >= len(cases) // 2
