"""O1 (PD_MTP_FLOW §10.1): greedy outputs are identical with and without MTP, token for token."""
from __future__ import annotations

import pytest

from fastdeploy.schema.sampling_params import SamplingParams
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


def greedy_with_stop_sequences(model, case) -> list[int]:
    """The PD_MTP_FLOW §10.2 greedy oracle with OPS §5.3's stop rule: output index j becomes the end token (EOS) when
    the j tokens before it end with a stop sequence and j + 1 >= min_tokens; that end token is not emitted (the
    request ends at the stop string's last token, docs/serving.md `stop`), so the output is the j tokens."""
    greedy = model.greedy_generate(case.prompt, case.params.max_tokens, case.params.min_tokens)
    stops = [model.tokenizer.encode(s, add_special_tokens=False) for s in case.params.stop]
    for j in range(len(greedy)):
        if j + 1 >= case.params.min_tokens and any(j >= len(s) and greedy[j - len(s):j] == s for s in stops):
            return greedy[:j]
    return greedy


def test_no_spec_output_equals_target_only_greedy_decoding(toy_cases, toy_no_spec):
    """PD_MTP_FLOW §10.2 and OPS §5.3: the engine without speculation emits the target's greedy tokens, with EOS
    suppressed at output index i while i + 1 < min_tokens, cut after the first stop sequence. The workload must cover the O4 rows for this to mean something: EOS at many positions, max_tokens
    1 and 2, stop sequences that fire, prompts long enough to need chunked prefill."""
    model = get_model("fd-toy")
    for case, out in zip(toy_cases, toy_no_spec):
        assert out.outputs.token_ids == greedy_with_stop_sequences(model, case), case.name
    eos_positions = {len(o.outputs.token_ids) - 1 for c, o in zip(toy_cases, toy_no_spec)
                     if o.outputs.finish_reason == "stop" and not c.params.stop}
    assert set(range(16)) <= eos_positions
    assert any(c.params.max_tokens == 1 for c in toy_cases) and any(c.params.max_tokens == 2 for c in toy_cases)
    fired = [c for c, o in zip(toy_cases, toy_no_spec) if c.params.stop and
             o.outputs.token_ids != model.greedy_generate(c.prompt, c.params.max_tokens, c.params.min_tokens)]
    assert len(fired) >= 4
    assert max(len(c.prompt) for c in toy_cases) > 3 * 16


@pytest.mark.parametrize("k", [1, 2, 3])
def test_mtp_output_equals_no_spec_on_fd_toy(toy_cases, toy_no_spec, k):
    """O1 for MTP K in {1, 2, 3} on the workload above, single instance; resources all free afterwards (O3)."""
    assert_same_outputs(toy_cases, toy_no_spec, run(toy_cases, k=k))


def test_mtp_acceptance_metrics_add_up_per_request(toy_cases):
    """The metrics users read (docs/design.md, the CLI's accept length): per request, the rounds' token counts
    sum to the output length less the prompt's token t0, every round verifies 1..K drafts and emits 1..K + 1
    tokens, and accepted drafts = tokens - rounds. The workload exercises both ways: some rounds accept every draft,
    some reject the first."""
    k = 2
    model = get_model("fd-toy")
    outputs = run(toy_cases, k=k)
    for case, out in zip(toy_cases, outputs):
        m = out.metrics
        assert m.num_decode_rounds == len(m.accepted_per_round), case.name
        # a request its stop string ended emits up to the string's last token; the engine wrote its end token too
        fired = any(model.tokenizer.decode(out.outputs.token_ids).endswith(s) for s in case.params.stop)
        assert sum(m.accepted_per_round) == len(out.outputs.token_ids) - 1 + fired, case.name
        assert all(1 <= n <= k + 1 for n in m.accepted_per_round), case.name
        assert m.num_decode_rounds <= m.num_draft_tokens <= k * m.num_decode_rounds, case.name
        assert m.num_accepted_drafts == sum(m.accepted_per_round) - m.num_decode_rounds, case.name
    rounds = [n for o in outputs for n in o.metrics.accepted_per_round]
    assert 1 in rounds and k + 1 in rounds


def test_gpu_runner_output_equals_xpu_runner(toy_cases, toy_no_spec):
    """Both device runners share one base (docs/design.md §5): same outputs, here with MTP K = 2."""
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
