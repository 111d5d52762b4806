"""The liveness watchdog (engine/watchdog.py, PD_MTP_FLOW §10 O3): a hang or livelock fails within a number of
steps bounded by the work requested, with an error naming the stuck requests; it never runs into an outer
timeout, and it never fires on a correct run. Each test also bounds the steps itself (`guard_steps`), far above
where the watchdog fires on its deterministic workload, so a broken watchdog fails the test in seconds instead of
running into the test's time limit."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.engine.watchdog import Watchdog
from fastdeploy.entrypoints.llm import LLM
from tests.e2e.workloads import TOY_ENGINE, Case
from tests.pd.harness import MAX_IDLE_STEPS, drive, start_pd, submit

from .helpers import message


def hide_every_token(runner) -> None:
    """The PD_MTP_FLOW §8 hang on every slot: the runner computes, but its step message reports count 0 everywhere."""
    execute = runner.execute_model

    def execute_and_hide(plan):
        output = execute(plan)
        bsz = int(output.message[1]) if output.message.size > 1 else 0
        width = (output.message.size - 2 - bsz) // bsz if bsz else 1
        return dataclasses.replace(output, message=message([[]] * bsz, width))

    runner.execute_model = execute_and_hide


def guard_steps(monkeypatch, engine, limit: int) -> None:
    """Fail the test (AssertionError, which no `pytest.raises(RuntimeError)` swallows) once `engine` has stepped
    `limit` times: the watchdog under test should have stopped the loop long before."""
    step, count = engine.step, [0]

    def counted_step(*args, **kwargs):
        count[0] += 1
        if count[0] > limit:
            raise AssertionError(f"the watchdog did not fire within {limit} steps")
        return step(*args, **kwargs)

    monkeypatch.setattr(engine, "step", counted_step)


def test_llm_fails_a_request_that_never_reports_a_token_naming_it(monkeypatch):
    """O3 on a single instance: with every token hidden, generate() raises after max_idle_steps steps, naming the
    request, its state, its tokens so far and what it holds."""
    llm = LLM(max_idle_steps=30, **TOY_ENGINE)
    hide_every_token(llm.engine.runner)
    guard_steps(monkeypatch, llm.engine, 10 * 30)
    with pytest.raises(RuntimeError, match=r"LLM: no token emitted and no request finished in 30 steps .*stuck: "
                                           r"mixed: \[0 \(running(, parked)?, 0 tokens, \d+ computed, slot 0, "
                                           r"\d+ blocks\)\]"):
        llm.generate([[256, 97, 98, 99]], SamplingParams(max_tokens=8))


def preemption_cases() -> list[Case]:
    """tests/pd's preemption workload (test_preemption_reports_minus_9_once_and_recomputes_on_d)."""
    rng = np.random.default_rng(5)
    return [Case(f"long_{i}", [256, *rng.integers(32, 127, int(rng.integers(4, 30))).tolist()],
                 SamplingParams(max_tokens=40, min_tokens=30)) for i in range(8)]


def test_p_blocks_never_released_after_handoff_fails_in_bounded_steps_naming_the_stuck_requests(monkeypatch):
    """The livelock the queue-snapshot watchdog missed (it ran into CI's limit): P's blocks are kept after each
    hand-off and never freed, so P runs short of blocks and preempts and re-admits the same request every two
    steps while its queue sizes and token counts cycle. The monotone count (tokens emitted + requests
    finished) stops growing, and the run fails within (work + 1) * MAX_IDLE_STEPS steps naming what P and D
    still hold."""
    cases = preemption_cases()
    run = start_pd(1, num_kv_blocks=34, max_num_seqs=4)
    resources = run.engine.prefill.resources
    # The defect: every handed-off request's blocks are kept for a transfer that is never reported finished.
    release = resources.release
    monkeypatch.setattr(resources, "release", lambda request, keep_blocks=False: release(
        request, keep_blocks=keep_blocks or request.finish_reason == "handed_off"))
    # It fires near step 70 on this seeded, fake-clocked workload; 5x that is still far below the general bound.
    guard_steps(monkeypatch, run.engine, 5 * MAX_IDLE_STEPS)
    submit(run, cases)
    with pytest.raises(AssertionError, match=r"O3.*(stuck: prefill: \[.*; decode: \[|running: \['\w+'\])"):
        drive(run)
    work = sum(c.params.max_tokens + 1 for c in cases)
    assert run.steps <= (work + 1) * MAX_IDLE_STEPS


@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_max_idle_steps_must_be_a_positive_int(value):
    """Bad input: ValueError naming the argument."""
    with pytest.raises(ValueError, match="'max_idle_steps'"):
        Watchdog(None, value, owner="LLM")


def test_d_stalled_holding_a_received_handoff_is_named_in_the_stall_report(monkeypatch):
    """O3 on D: a hand-off D has received and verified, whose first round is never scheduled, stalls the pair;
    the watchdog's report names that request as a received hand-off with the slot and blocks it holds (the stall
    report used to raise ValueError itself whenever D held a received hand-off)."""
    run = start_pd(1)
    run.decode_trace.max_idle_steps = run.prefill_trace.max_idle_steps = 10 ** 6   # the watchdog is under test
    monkeypatch.setattr(run.engine.decode.scheduler, "_insert_prefilled", lambda plan: None)
    submit(run, preemption_cases()[:1])
    with pytest.raises(AssertionError, match=r"O3 watchdog: .* decode: \[0 \(hand-off received, first round not "
                                             r"scheduled, 1 tokens, \d+ computed, slot 0, \d+ blocks\)\]"):
        drive(run)
