"""Preemption between a stop sequence's first and second token (PD_MTP_FLOW §7.2, OPS §5.3): the recomputed
request's history (`pre_ids`, `step_idx`) is restored, so the stop sequence still matches across the preemption
and the output equals the run without preemption."""
from __future__ import annotations

import pytest

from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.entrypoints.llm import LLM
from fastdeploy.model_executor.models import get_model

from .workloads import TOY_ENGINE

MODEL = get_model("fd-toy")
STOP_AT = 5          # output index of the stop sequence's first token
MAX_TOKENS = 20


def stop_case(seed: int) -> tuple[list[int], tuple[int, int]]:
    """A prompt and a two-token stop sequence that first occurs at output indices STOP_AT, STOP_AT + 1 of its greedy
    output (and not earlier, nor as an EOS)."""
    prompt = MODEL.find_prompt(MAX_TOKENS + 5, 9, seed)   # no EOS within MAX_TOKENS
    greedy = MODEL.greedy_generate(prompt, STOP_AT + 2)
    stop = (greedy[STOP_AT], greedy[STOP_AT + 1])
    assert all(tuple(greedy[i:i + 2]) != stop for i in range(STOP_AT)), "stop sequence occurs early; pick a seed"
    return prompt, stop


def generate(prompt: list[int], stop: tuple[int, int], k: int, preempt_at: int | None):
    """One request on fd-toy (every MTP draft rejected, so one token per round). With `preempt_at`, the scheduler
    is made to preempt the request once, in the step after its output reached `preempt_at` tokens. Returns the
    request and the (pre_ids[1:1 + n], step_idx, outputs) the runner held after each recompute insertion."""
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    llm = LLM(speculative_config=spec, model_options={"mtp_agreement": 0.0}, **TOY_ENGINE)
    scheduler, runner = llm.engine.scheduler, llm.engine.runner
    schedule, insert = scheduler.schedule, runner.insert_tasks
    restored = []

    def schedule_with_one_preemption():
        plan = schedule()
        ready = [r for r in scheduler.running if len(r.output_token_ids) == preempt_at and not r.is_preempting
                 and r.metrics.num_preemptions == 0 and not r.is_prefilling]
        if ready and not plan.preempt_tasks:
            scheduler._preempt_newest(plan)
        return plan

    def insert_and_record(plan):
        insert(plan)
        for task in plan.prefill_tasks:
            if task.completes_prefill and task.output_token_ids:
                n = len(task.output_token_ids)
                restored.append((runner.state.pre_ids[task.slot, 1:1 + n].tolist(),
                                 int(runner.state.step_idx[task.slot]), list(task.output_token_ids)))

    if preempt_at is not None:
        scheduler.schedule = schedule_with_one_preemption
        runner.insert_tasks = insert_and_record
    # The engine takes the stop sequence as token ids (LLM.generate would encode a stop string).
    request = llm.engine.add_request("0", prompt, SamplingParams(max_tokens=MAX_TOKENS), stop_seqs=(stop,))
    llm._run_until_done()
    return request, restored


@pytest.mark.parametrize("k", [0, 1])
@pytest.mark.parametrize("seed", [3, 8])
def test_preemption_after_a_stop_sequences_first_token_keeps_the_match(k, seed):
    """PD_MTP_FLOW §7.2: preempted right after the stop sequence's first token, the request is recomputed with
    pre_ids[1..step_idx] = outputs and step_idx = len(outputs), so the second token still completes the match:
    output and finish reason equal the run without preemption, which stops at the sequence (guarded here)."""
    prompt, stop = stop_case(seed)
    plain, _ = generate(prompt, stop, k, preempt_at=None)
    assert plain.finish_reason == "stop" and len(plain.output_token_ids) < MAX_TOKENS
    assert tuple(plain.output_token_ids[STOP_AT:STOP_AT + 2]) == stop
    preempted, restored = generate(prompt, stop, k, preempt_at=STOP_AT + 1)
    assert preempted.metrics.num_preemptions == 1, "the forced preemption did not happen"
    assert (preempted.output_token_ids, preempted.finish_reason) == \
        (plain.output_token_ids, plain.finish_reason)
    assert restored, "no recompute insertion was seen"
    for pre_ids, step_idx, outputs in restored:
        assert (pre_ids, step_idx) == (outputs, len(outputs)), "pre_ids / step_idx not restored (PD_MTP_FLOW §7.2)"
    assert restored[-1][2] == plain.output_token_ids[:STOP_AT + 1]
