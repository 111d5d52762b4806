"""Async scheduling (docs/design.md §10): the engine plans step N + 1 and applies step N's outputs while step N + 1
computes on the runner thread. The outputs must be the sequential loop's, token for token, on the suite's oracle
workloads: the fd-toy mix (EOS at every position, max_tokens 1 and 2, min_tokens, stop sequences, chunked prompts)
with MTP K = 0, 1, 2, a KV pool small enough to park and preempt, logprobs, seeded sampling, prefix-cache hits,
the in-process PD pair, and aborts. fd-toy's logits are a function of the context alone, so a request's tokens
cannot depend on which step (batch) computed them; fd-tiny is compared one request at a time for the same reason.
"""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.ops.step_message import PREEMPTED_TOKEN_ID, decode_step_message

from tests.e2e.workloads import TOY_ENGINE, assert_same_outputs, run, toy_workload


def _spec(k: int) -> dict | None:
    return {"method": "mtp", "num_speculative_tokens": k} if k else None


@pytest.mark.parametrize("k", [0, 1, 2])
def test_the_oracle_workload_is_the_same_with_async_scheduling(k):
    cases = toy_workload(seed=7)
    assert_same_outputs(cases, run(cases, k), run(cases, k, async_scheduling=True))


@pytest.mark.parametrize("k, blocks", [(0, 34), (1, 34), (2, 40)])
def test_a_pool_that_parks_and_preempts_gives_the_same_outputs(k, blocks):
    """The mix over a pool barely larger than its largest request (tests/e2e/test_liveness.py's O4 pools): slots
    park at block boundaries and the newest request is preempted, while the scheduler's view lags one step behind
    the runner's (a preemption may reach a slot after its last round)."""
    cases = toy_workload(seed=11)
    seen = {"preempted": 0, "parked": 0}

    def on_step(step):
        seen["preempted"] += len(step.plan.preempt_tasks)
        seen["parked"] += len(step.output.parked_slots)

    expected = run(cases, k, num_kv_blocks=blocks)
    actual = run(cases, k, num_kv_blocks=blocks, async_scheduling=True, trace_hook=on_step)
    assert_same_outputs(cases, expected, actual)
    assert seen["preempted"] and seen["parked"], f"the pool was meant to preempt and park: {seen}"


def _generate(async_scheduling: bool, prompts, params, **engine):
    llm = LLM(**{**TOY_ENGINE, **engine}, async_scheduling=async_scheduling)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    engines = getattr(llm.engine, "engines", (llm.engine,))   # the PD pair's P and D, or the one instance
    assert not any(e.anomalies or e.has_unfinished() for e in engines)
    return outputs


@pytest.mark.parametrize("k", [0, 1])
def test_logprobs_seeded_sampling_and_prefix_hits_are_the_same(k):
    cases = toy_workload(seed=3)[:20]
    prompts = [c.prompt for c in cases] * 2            # the second copy hits the first's cached blocks
    params = [SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, seed=100 + i, logprobs=3)
              for i in range(len(prompts))]
    want = _generate(False, prompts, params, speculative_config=_spec(k))
    got = _generate(True, prompts, params, speculative_config=_spec(k))
    assert any(o.num_cached_tokens for o in got), "the repeated prompts were meant to hit the prefix cache"
    for i, (a, b) in enumerate(zip(want, got)):
        assert (b.outputs.token_ids, b.outputs.finish_reason) == (a.outputs.token_ids, a.outputs.finish_reason), i
        assert b.outputs.logprobs == a.outputs.logprobs, i
    # each repeat is admitted long after its first copy's prompt was computed, so both loops have named the same
    # blocks in the cache by then: the hits are equal too (the blocks of a step are named when it is applied)
    assert [o.num_cached_tokens for o in got] == [o.num_cached_tokens for o in want]


@pytest.mark.parametrize("k", [0, 1, 2])
def test_the_in_process_pd_pair_is_the_same_with_async_scheduling(k):
    cases = toy_workload(seed=7)[:30]
    prompts, params = [c.prompt for c in cases], [c.params for c in cases]
    want = _generate(False, prompts, params, speculative_config=_spec(k), splitwise=True)
    got = _generate(True, prompts, params, speculative_config=_spec(k), splitwise=True)
    assert_same_outputs(cases, want, got)


def test_fd_tiny_with_mtp_is_the_same_one_request_at_a_time():
    prompts = ["The cat sat on the mat and", "Once upon a time, in a land far away,", "Hello, my name is"]
    params = SamplingParams(max_tokens=24, temperature=0)
    engine = dict(model="fd-tiny", max_num_seqs=1, block_size=8, max_model_len=96, max_num_batched_tokens=24,
                  speculative_config=_spec(2))
    want = _generate(False, prompts, params, **engine)
    got = _generate(True, prompts, params, **engine)
    assert [o.outputs.token_ids for o in got] == [o.outputs.token_ids for o in want]


def test_a_preemption_that_reaches_a_slot_after_its_last_round_does_not_touch_the_slots_next_request():
    """One slot. Request A's last round is in flight when A is aborted: the abort's preemption goes out with the
    next plan and the runner answers it (-9) in the step after A stopped, by which time A is finished and its slot
    planned for request B. The -9 belongs to A (the owner when that plan was made): B runs undisturbed."""
    minus_nines = []

    def on_step(step):
        decoded = decode_step_message(step.output.message)
        if decoded is not None and any(entry == [PREEMPTED_TOKEN_ID] for entry in decoded[1]):
            minus_nines.append(step.plan.step)

    engine_options = {**TOY_ENGINE, "max_num_seqs": 1}
    llm = LLM(**engine_options, async_scheduling=True, trace_hook=on_step)
    engine = llm.engine
    prompt_a = llm.model.find_prompt(eos_index=20, prompt_len=6, seed=1)
    prompt_b = llm.model.find_prompt(eos_index=4, prompt_len=6, seed=2)
    a = engine.add_request("a", prompt_a, SamplingParams(max_tokens=3))
    for _ in range(3):                      # steps 1-3 submitted: A's prefill (t0) and two rounds, the last in flight
        engine.step()
    assert a.status.name == "RUNNING" and len(a.output_token_ids) == 2
    assert engine.abort("a")                # A looks running to the scheduler: a preemption is planned
    b = engine.add_request("b", prompt_b, SamplingParams(max_tokens=8))
    while engine.has_unfinished():
        engine.step()
    assert (a.finish_reason, len(a.output_token_ids)) == ("length", 3)   # A ended by its own last round
    assert minus_nines, "the runner was meant to answer the preemption after A's last round"
    assert b.metrics.num_preemptions == 0 and not engine.anomalies
    alone = LLM(**engine_options).generate([prompt_b], SamplingParams(max_tokens=8), use_tqdm=False)[0]
    assert (b.output_token_ids, b.finish_reason) == (alone.outputs.token_ids, alone.outputs.finish_reason)


def test_the_async_scheduling_benchmark_runs_in_smoke_mode(capsys):
    from benchmarks import async_scheduling

    async_scheduling.main(["--smoke"])
    lines = capsys.readouterr().out.splitlines()
    assert "seq tok/s" in lines[1] and "async" in lines[1]
    row = lines[2].split()
    assert row[:3] == ["fd-toy", "4", "1"] and float(row[3]) > 0 and float(row[4]) > 0 and "elsewhere" in lines[2]
