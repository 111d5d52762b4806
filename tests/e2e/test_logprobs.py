"""Logprobs that survive PD + MTP (docs/design.md §5 "Logprobs" and docs/design.md §6 decision 11): each emitted
token's logprob and top-N list are log_softmax of the target's raw logits at its position, from the prompt's pass
for t0 and from the verification pass for accepted drafts and the corrected / bonus token; greedy logprobs are the
same with and without MTP and PD, bit for bit where the target's logits for a position are (fd-toy: a function of
the context; fd-tiny: a request alone, so every pass has the same shape), else within the documented tolerance."""
from __future__ import annotations

import numpy as np
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.models import get_model
from fastdeploy.model_executor.models.base import ForwardBatch
from fastdeploy.model_executor.xpu_pre_and_post_process import log_softmax64
from fastdeploy.model_executor.models.tokenizer import EOS_ID

from .workloads import TOY_ENGINE, toy_workload

# docs/design.md §5 "Logprobs": |logprob difference| between two batch shapes of the same position
TOLERANCE = {"float32": 1e-4, "float64": 1e-12}
TINY_ENGINE = dict(model="fd-tiny", max_num_seqs=4, block_size=8, max_model_len=96, max_num_batched_tokens=24)
TINY_PROMPTS = ["On Monday, Judy", "The cat sat on the mat and", "Hello, my name is", "1 2 3 4",
                "Once upon a time, in a land far away,"]
CONFIGS = [(pd, k) for pd in (False, True) for k in (0, 1, 2)]


def _spec(k: int) -> dict | None:
    return {"method": "mtp", "num_speculative_tokens": k} if k else None


def reference_logprobs(model, prompt: list[int], outputs: list[int]) -> np.ndarray:
    """[len(outputs), V]: log_softmax64 of the target logits predicting each output token, from one pass over the
    whole sequence (prompt + outputs but the last) on a fresh cache."""
    sequence = np.asarray(list(prompt) + list(outputs[:-1]), np.int64)
    block = 16
    blocks = -(-len(sequence) // block)
    kv = model.new_kv_cache(blocks, block)
    batch = ForwardBatch(sequence, np.arange(len(sequence)), [0, len(sequence)], np.arange(blocks)[None])
    logits, _ = model.forward(batch, kv)
    return log_softmax64(logits.numpy()[len(prompt) - 1:])


def ranked(row: np.ndarray, n: int) -> list[int]:
    return np.argsort(-row, kind="stable")[:n].tolist()


def assert_same_ranking(got: tuple[int, ...], want: list[int], values: np.ndarray, atol: float, where: str) -> None:
    """Equal top-N ids, except that two alternatives whose logprobs (`values`, [V]) are within `atol` may be in
    either order."""
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w or abs(values[g] - values[w]) <= atol, f"{where}: top[{i}] is {g}, expected {w}"
    assert len(got) == len(want), where


def same_rank_or_near_tie(got, want, i: int, atol: float) -> bool:
    """The i-th alternative of two TokenLogprob entries is the same id, or a near tie in `want`: the other id's
    logprob within `atol` (or, at the last rank, an id `want` ranked just past its list at the same value)."""
    a, b = got.top_token_ids[i], want.top_token_ids[i]
    if a == b:
        return True
    value = dict(zip(want.top_token_ids, want.top_logprobs)).get(a)
    if value is None:
        return i == len(want.top_token_ids) - 1 and abs(got.top_logprobs[i] - want.top_logprobs[i]) <= atol
    return abs(value - want.top_logprobs[i]) <= atol


def generate(llm: LLM, prompts, params, alone: bool = False):
    if alone:
        return [llm.generate([p], [sp], use_tqdm=False)[0] for p, sp in zip(prompts, params)]
    return llm.generate(prompts, params, use_tqdm=False)


@pytest.fixture(scope="module")
def toy_cases():
    cases = toy_workload(7)
    return cases, [SamplingParams(**{**{f: getattr(c.params, f) for f in ("max_tokens", "min_tokens", "stop")},
                                     "logprobs": i % 6}) for i, c in enumerate(cases)]


@pytest.fixture(scope="module")
def toy_outputs(toy_cases):
    cases, params = toy_cases
    return {(pd, k): generate(LLM(speculative_config=_spec(k), splitwise=pd, **TOY_ENGINE),
                              [c.prompt for c in cases], params) for pd, k in CONFIGS}


def test_fd_toy_logprobs_are_the_target_log_softmax_bit_for_bit(toy_cases, toy_outputs):
    """Single instance, no speculation, on the fd-toy workload (EOS at many positions, max_tokens 1 and 2,
    min_tokens over EOS, stop sequences, chunked long prompts): one entry per output token, its logprob exactly
    log_softmax64 of the target's logits at that position — also under min_tokens, whose EOS suppression is not
    applied (raw logprobs) — and the top-N ids in rank order. The EOS that a stop sequence puts in place of a token
    (OPS §5.3) is not emitted: the request ends at the stop string's last token (docs/serving.md `stop`)."""
    cases, params = toy_cases
    model = get_model("fd-toy")
    suppressed = replaced = 0
    for case, sp, out in zip(cases, params, toy_outputs[(False, 0)]):
        tokens, entries = out.outputs.token_ids, out.outputs.logprobs
        assert [e.token_id for e in entries] == tokens, case.name
        ref = reference_logprobs(model, case.prompt, tokens)
        for i, (token, entry) in enumerate(zip(tokens, entries)):
            assert entry.logprob == ref[i, token], f"{case.name}[{i}]"
            assert list(entry.top_token_ids) == ranked(ref[i], sp.logprobs), f"{case.name}[{i}]"
            assert list(entry.top_logprobs) == ref[i, ranked(ref[i], sp.logprobs)].tolist(), f"{case.name}[{i}]"
            suppressed += i + 1 < sp.min_tokens and ranked(ref[i], 1) == [EOS_ID]
            replaced += token == EOS_ID and ranked(ref[i], 1) != [EOS_ID]
    assert suppressed and not replaced, (suppressed, replaced)   # the workload exercises min_tokens


@pytest.mark.parametrize("pd,k", CONFIGS[1:], ids=[f"{'pd' if pd else 'single'}-k{k}" for pd, k in CONFIGS[1:]])
def test_fd_toy_logprobs_identical_across_single_pd_and_mtp(toy_outputs, pd, k):
    """O1 extended to logprobs: tokens, logprobs and top-N lists of every request equal the single instance's
    without speculation, bit for bit (fd-toy's logits are a function of the context, so any difference is the
    pipeline's: a misaligned entry, a lost t0 across the hand-off, a draft's logprob taken from the wrong row)."""
    for want, got in zip(toy_outputs[(False, 0)], toy_outputs[(pd, k)]):
        assert got.outputs.token_ids == want.outputs.token_ids
        assert got.outputs.logprobs == want.outputs.logprobs, got.request_id


def test_logprobs_survive_preemption(toy_cases, toy_outputs):
    """A preempted request is recomputed from prompt + outputs (PD_MTP_FLOW §7.2): its logprobs stay one per
    token and equal those of the run without preemption."""
    cases, params = toy_cases
    llm = LLM(speculative_config=_spec(2), **{**TOY_ENGINE, "num_kv_blocks": 40})
    outputs = generate(llm, [c.prompt for c in cases], params)
    assert sum(o.metrics.num_preemptions for o in outputs) > 0
    for want, got in zip(toy_outputs[(False, 0)], outputs):
        assert got.outputs.logprobs == want.outputs.logprobs, got.request_id


def test_logprobs_only_for_requests_that_ask():
    """No cost otherwise: a step with no asking slot returns no logprobs (RunnerOutput.logprobs is None); in a
    mixed batch only the asking request gets entries, and its entries are the same as when it runs alone."""
    steps = []
    llm = LLM(speculative_config=_spec(1), trace_hook=steps.append, **TOY_ENGINE)
    plain = llm.generate(["hello", "world"], SamplingParams(max_tokens=8, min_tokens=8), use_tqdm=False)
    assert steps and all(s.output.logprobs is None for s in steps)
    assert all(o.outputs.logprobs is None for o in plain)
    asking = SamplingParams(max_tokens=8, min_tokens=8, logprobs=2)
    mixed = llm.generate(["hello", "world"], [SamplingParams(max_tokens=8, min_tokens=8), asking], use_tqdm=False)
    alone = llm.generate(["world"], asking, use_tqdm=False)[0]
    assert mixed[0].outputs.logprobs is None and mixed[0].outputs.token_ids == plain[0].outputs.token_ids
    assert mixed[1].outputs.logprobs == alone.outputs.logprobs and len(alone.outputs.logprobs) == 8


@pytest.fixture(scope="module")
def tiny_outputs():
    """fd-tiny in float64 and float32, single / PD x K = 0, 1, 2, batched with chunked prefill."""
    params = [SamplingParams(max_tokens=16, logprobs=5)] * len(TINY_PROMPTS)
    return {(dtype, pd, k): generate(LLM(dtype=dtype, speculative_config=_spec(k), splitwise=pd, **TINY_ENGINE),
                                     TINY_PROMPTS, params)
            for dtype in ("float64", "float32") for pd, k in CONFIGS}


@pytest.mark.parametrize("pd,k", CONFIGS, ids=[f"{'pd' if pd else 'single'}-k{k}" for pd, k in CONFIGS])
def test_fd_tiny_logprobs_equal_a_float64_full_sequence_forward(tiny_outputs, pd, k):
    """fd-tiny float64 (single / PD x K): every emitted token's logprob and top-5 equal log_softmax of a reference
    forward over the whole sequence at that position within 1e-10 (the passes differ in shape only)."""
    model = get_model("fd-tiny", dtype="float64")
    for prompt, out in zip(TINY_PROMPTS, tiny_outputs[("float64", pd, k)]):
        tokens, entries = out.outputs.token_ids, out.outputs.logprobs
        ref = reference_logprobs(model, out.prompt_token_ids, tokens)
        assert [e.token_id for e in entries] == tokens and len(tokens) == 16, prompt
        for i, (token, entry) in enumerate(zip(tokens, entries)):
            assert abs(entry.logprob - ref[i, token]) <= 1e-10, f"{prompt}[{i}]"
            assert_same_ranking(entry.top_token_ids, ranked(ref[i], 5), ref[i], 1e-10, f"{prompt}[{i}]")
            np.testing.assert_allclose(entry.top_logprobs, ref[i, list(entry.top_token_ids)], rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_fd_tiny_greedy_logprobs_agree_across_single_pd_and_mtp(tiny_outputs, dtype):
    """Greedy, batched with chunked prefill, fd-tiny in float64 and float32: identical tokens in all six
    configurations; logprobs within the documented tolerance of single K = 0 (the target's logits for a position
    differ in the last bits between batch shapes); top-5 ids identical up to alternatives within it."""
    atol = TOLERANCE[dtype]
    base = tiny_outputs[(dtype, False, 0)]
    for pd, k in CONFIGS[1:]:
        for want, got in zip(base, tiny_outputs[(dtype, pd, k)]):
            assert got.outputs.token_ids == want.outputs.token_ids, (pd, k)
            for i, (w, g) in enumerate(zip(want.outputs.logprobs, got.outputs.logprobs)):
                where = f"{'pd' if pd else 'single'} k{k} {want.prompt!r}[{i}]"
                assert abs(g.logprob - w.logprob) <= atol, where
                assert len(g.top_token_ids) == len(w.top_token_ids) == 5, where
                assert all(same_rank_or_near_tie(g, w, j, atol) for j in range(5)), where
                np.testing.assert_allclose(g.top_logprobs, w.top_logprobs, rtol=0, atol=atol, err_msg=where)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_fd_tiny_pd_logprobs_bit_identical_to_single_for_a_request_alone(k):
    """A request alone passes through the same shapes on a single instance and on P + D (the prompt in the same
    chunks, the same decode rounds), and t0's logprobs cross the hand-off as exact JSON floats: every logprob and
    top-5 list is bit for bit the single instance's (fd-tiny float32, the serving default)."""
    params = [SamplingParams(max_tokens=12, logprobs=5)] * 2
    single = generate(LLM(speculative_config=_spec(k), **TINY_ENGINE), TINY_PROMPTS[:2], params, alone=True)
    pd = generate(LLM(speculative_config=_spec(k), splitwise=True, **TINY_ENGINE), TINY_PROMPTS[:2], params,
                  alone=True)
    for want, got in zip(single, pd):
        assert got.outputs.token_ids == want.outputs.token_ids
        assert got.outputs.logprobs == want.outputs.logprobs


@pytest.mark.parametrize("value", [-1, 21, True, 2.0])
def test_sampling_params_logprobs_is_validated(value):
    with pytest.raises(ValueError, match="'logprobs'"):
        SamplingParams(logprobs=value)
