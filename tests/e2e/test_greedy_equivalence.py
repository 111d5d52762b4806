"""O1 (PD_MTP_FLOW §10.1): greedy outputs are identical with and without MTP, token for token."""
from __future__ import annotations

import pytest

from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.model_executor.models import get_model
from fastdeploy.model_executor.models.tokenizer import EOS_ID

from .workloads import assert_same_outputs, run, toy_workload

SEED = 7


@pytest.fixture(scope="module")
def toy_cases():
    return toy_workload(SEED)


@pytest.fixture(scope="module")
def toy_no_spec(toy_cases):
    return run(toy_cases, k=0)


def test_no_spec_output_equals_target_only_greedy_decoding(toy_cases, toy_no_spec):
    """§10.2: the engine without speculation emits the target's greedy tokens, with EOS suppressed at output
    index i while i + 1 < min_tokens (cases without stop sequences; those are covered by O1 below)."""
    model = get_model("fd-toy")
    checked = 0
    for case, out in zip(toy_cases, toy_no_spec):
        if case.params.stop:
            continue
        expected = model.greedy_generate(case.prompt, case.params.max_tokens, case.params.min_tokens)
        assert out.outputs.token_ids == expected, case.name
        checked += 1
    assert checked >= 40


def test_workload_covers_the_seed_scenarios(toy_cases, toy_no_spec):
    """O4 rows on a single instance: EOS at many positions, max_tokens 1 and 2, min_tokens beyond the natural
    EOS, stop sequences that fire, prompts long enough to need chunked prefill."""
    eos_positions = {len(o.outputs.token_ids) - 1 for c, o in zip(toy_cases, toy_no_spec)
                     if o.outputs.finish_reason == "stop" and not c.params.stop}
    assert set(range(16)) <= eos_positions
    assert any(c.params.max_tokens == 1 for c in toy_cases) and any(c.params.max_tokens == 2 for c in toy_cases)
    def stopped_by_sequence(case, out):
        tokens = out.outputs.token_ids    # a match puts the end token right after the sequence (OPS §5.3)
        return tokens[-1] == EOS_ID and any(tokens[:-1][-len(s):] == list(s.encode()) for s in case.params.stop)

    fired = [c for c, o in zip(toy_cases, toy_no_spec) if c.params.stop and stopped_by_sequence(c, o)]
    assert len(fired) >= 4
    assert max(len(c.prompt) for c in toy_cases) > 3 * 16


@pytest.mark.parametrize("k", [1, 2, 3])
def test_mtp_output_equals_no_spec_on_fd_toy(toy_cases, toy_no_spec, k):
    """O1 for MTP K in {1, 2, 3} on the workload above, single instance; resources all free afterwards (O3)."""
    assert_same_outputs(toy_cases, toy_no_spec, run(toy_cases, k=k))


def test_mtp_drafts_are_accepted_and_rejected(toy_cases):
    """The workload exercises verification both ways: some rounds accept every draft, some reject the first."""
    outputs = run(toy_cases, k=2)
    rounds = [n for o in outputs for n in o.metrics.accepted_per_round]
    assert 1 in rounds and 3 in rounds
    assert sum(o.metrics.num_accepted_drafts for o in outputs) < sum(o.metrics.num_draft_tokens for o in outputs)


def test_gpu_runner_output_equals_xpu_runner(toy_cases, toy_no_spec):
    """Both device runners share one base (STYLE §5.4): same outputs, here with MTP K = 2."""
    assert_same_outputs(toy_cases, toy_no_spec, run(toy_cases, k=2, runner="gpu"))


@pytest.mark.emulator
def test_mtp_output_equals_no_spec_with_emulated_kunlun3_ops(toy_cases, toy_no_spec):
    """O1 with every state op running its Kunlun3 kernel on the host emulator (OPS §2.1 backends)."""
    subset = toy_cases[::2]
    assert_same_outputs(subset, toy_no_spec[::2], run(subset, k=2, ops_backend="xpu3-emulator"))


def test_mtp_output_equals_no_spec_on_fd_tiny_float64():
    """O1 on the real transformer in float64 (batch-invariant enough for exact greedy equality)."""
    from fastdeploy.model_executor.models import fd_tiny
    assert fd_tiny.WEIGHTS_PATH.is_file(), "the committed fd-tiny weights are missing from the package"
    prompts = ["The cat", "Hello, my name is", "Once upon a time", "1 2 3 4", "The weather today",
               "A B C", "She said that", "In the beginning", "Numbers: 7, 8,", "Dear friend,", "x"]
    params = [SamplingParams(max_tokens=12 if i % 3 else 20, min_tokens=i % 4) for i in range(len(prompts))]
    cases_prompts = [list(p.encode()) for p in prompts]
    from fastdeploy.entrypoints.llm import LLM
    results = {}
    for k in (0, 1, 2):
        llm = LLM(model="fd-tiny", dtype="float64", max_num_seqs=4, block_size=8, max_model_len=64,
                  max_num_batched_tokens=24,
                  speculative_config={"method": "mtp", "num_speculative_tokens": k} if k else None)
        results[k] = [o.outputs.token_ids for o in llm.generate([[256, *p] for p in cases_prompts], params)]
    assert results[1] == results[0]
    assert results[2] == results[0]
