"""O3 liveness and the KV-pressure rows of O4 (PD_MTP_FLOW §7, §10): every request finishes, parking and preemption
change no output, and afterwards every slot and KV block is free."""
from __future__ import annotations

import numpy as np
import pytest

from .trace_checks import TraceChecker
from .workloads import assert_same_outputs, run, toy_workload

SEED = 11


@pytest.fixture(scope="module")
def cases():
    return toy_workload(SEED)


@pytest.fixture(scope="module")
def no_spec(cases):
    return run(cases, k=0)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_invariants_hold_on_every_step(cases, k):
    """I1, I4, I6 asserted on the step trace of the mixed workload, with an O3 watchdog."""
    checker = TraceChecker()
    run(cases, k=k, trace_hook=checker)
    assert checker.releases_checked >= len(cases) // 2


@pytest.mark.parametrize("k", [0, 2])
def test_kv_pressure_parks_and_resumes_without_changing_outputs(cases, no_spec, k):
    """O4 "block-step parking and recovery": a pool far smaller than the batch needs parks slots at stage 10
    and resumes them through block-table refreshes; outputs equal the unconstrained run (O1) and all resources
    are free afterwards (O3)."""
    checker = TraceChecker()
    outputs = run(cases, k=k, num_kv_blocks=40, trace_hook=checker)
    assert_same_outputs(cases, no_spec, outputs)
    assert checker.parked_steps > 0


@pytest.mark.parametrize("k", [0, 1, 3])
def test_preemption_recomputes_without_changing_outputs(cases, no_spec, k):
    """O4 "preemption": with a pool that fits barely more than the largest request, the scheduler preempts;
    each preemption is reported as -9 exactly once, the request is recomputed from prompt + outputs, and its
    output has neither gap nor repetition (O1)."""
    checker = TraceChecker()
    outputs = run(cases, k=k, num_kv_blocks=34, trace_hook=checker)
    assert_same_outputs(cases, no_spec, outputs)
    assert checker.preemptions > 0
    assert checker.preemptions == sum(o.metrics.num_preemptions for o in outputs)


@pytest.mark.parametrize("k", [1, 3])
def test_eos_in_first_decode_round_frees_slot_in_that_step(k):
    """O4 "EOS in the first decode round" on a single instance (the FastDeploy hang of PD_MTP_FLOW §8 on D): the EOS is
    reported in the step that produced it and the request's slot and blocks are free when that step returns."""
    from fastdeploy.schema.sampling_params import SamplingParams
    from fastdeploy.entrypoints.llm import LLM
    from fastdeploy.model_executor.models import get_model

    prompt = get_model("fd-toy").find_prompt(eos_index=1, prompt_len=9, seed=5)
    steps = []
    llm = LLM(model="fd-toy", speculative_config={"method": "mtp", "num_speculative_tokens": k}, max_num_seqs=2,
              block_size=4, max_model_len=64, trace_hook=steps.append)
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=10))
    assert out.outputs.finish_reason == "stop" and len(out.outputs.token_ids) == 2
    assert [len(s.finished) for s in steps] == [0, 1]        # prefill step (t0), then the first decode round
    assert steps[1].stats.free_slots == 2 and steps[1].stats.free_kv_blocks == steps[1].stats.total_kv_blocks


def _random_configs(seed: int, count: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    configs = []
    for _ in range(count):
        k, block_size = int(rng.integers(0, 4)), int(rng.choice([1, 2, 3, 4, 8, 16]))
        blocks_for_longest = -(-(128 + 3 * k + 4) // block_size)    # max_model_len 128: one request fits alone
        configs.append(dict(k=k, block_size=block_size, max_num_seqs=int(rng.integers(1, 9)),
                            max_num_batched_tokens=int(rng.integers(4, 40)),
                            num_kv_blocks=int(rng.integers(blocks_for_longest, 2 * blocks_for_longest)),
                            runner=str(rng.choice(["xpu", "gpu"]))))
    return configs


@pytest.mark.parametrize("config", _random_configs(seed=2024, count=6), ids=str)
def test_random_engine_configurations_keep_outputs_and_liveness(cases, no_spec, config):
    """O1 + O3 + I1/I4/I6 across seeded random block sizes, slot counts, token budgets, pool sizes, K and
    runner classes (pools between one and two full-length requests force parking and preemption)."""
    checker = TraceChecker(max_idle_steps=400)
    config = dict(config)
    assert_same_outputs(cases, no_spec, run(cases, k=config.pop("k"), trace_hook=checker, **config))
