"""fd-tiny with grouped attention vs the padded reference (docs/design.md §3): target and MTP logits and hidden
states bit-identical on decode-only passes (within rounding through the fused decode op), and every argmax kept on passes with prefill chunks (attended in tiles,
alone or next to decode rows; float32 and float64); the engine's greedy tokens and per-round acceptance unchanged."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.layers import fused_attention
from fastdeploy.model_executor.models import fd_tiny, get_model
from fastdeploy.model_executor.models.base import ForwardBatch

from .padded_attention_ref import PaddedFdTiny, PaddedPagedAttention

BLOCK = 16


def gen_pass(seed: int, queries: list[int], earlier: list[int]) -> tuple[ForwardBatch, np.ndarray]:
    """Seeded pass: sequence i queries queries[i] tokens after earlier[i] cached positions, on shuffled blocks;
    returns the batch and the token after each position (the MTP pass's input)."""
    rng = np.random.default_rng(seed)
    contexts = [e + q for e, q in zip(earlier, queries)]
    per_seq = -(-max(contexts) // BLOCK)
    tables = rng.permutation(per_seq * len(queries)).reshape(len(queries), per_seq).astype(np.int32)
    tokens = rng.integers(0, 256, sum(queries))
    positions = np.concatenate([np.arange(e, e + q) for e, q in zip(earlier, queries)])
    batch = ForwardBatch(tokens, positions, np.concatenate([[0], np.cumsum(queries)]), tables)
    return batch, rng.integers(0, 256, sum(queries))


def fill_cache(seed: int, model, batch: ForwardBatch):
    """A cache holding seeded K/V of the model's scale (standard normal) at every position."""
    rng = np.random.default_rng(seed)
    kv = model.new_kv_cache(batch.block_tables.size, BLOCK)
    kv.layers = [paddle.to_tensor(rng.standard_normal(t.shape).astype(model.dtype)) for t in kv.layers]
    return kv


def both_passes(model, batch: ForwardBatch, next_ids: np.ndarray, seed: int) -> list[np.ndarray]:
    """Target logits, hidden, then MTP logits and hidden over the same pass, from a fresh seeded cache."""
    kv = fill_cache(seed, model, batch)
    logits, hidden = model.forward(batch, kv)
    mtp_batch = ForwardBatch(next_ids, batch.positions, batch.seq_starts, batch.block_tables)
    mtp_logits, mtp_hidden = model.mtp_forward(mtp_batch, hidden, kv)
    return [t.numpy() for t in (logits, hidden, mtp_logits, mtp_hidden)]


# name: (queries, earlier positions)
SINGLE = {"decode-k2": ([3, 1, 2, 3, 3, 2, 1], [40, 17, 96, 5, 200, 63, 0]), "batch-1-verify": ([2], [54])}
MIXED = {"chunk-97": ([97], [0]), "later-chunk-54": ([54], [17]), "chunk-300-in-tiles": ([300], [45]),
         "31-decode-256-chunk": ([2] * 31 + [256], list(range(100, 410, 10)) + [0]),
         "awkward-chunks": ([4, 1, 17, 2, 4, 54, 3, 97], [17, 54, 0, 97, 120, 30, 9, 5])}


@pytest.fixture(scope="module", params=["float32", "float64"])
def models(request):
    model = get_model("fd-tiny", dtype=request.param)
    return model, PaddedFdTiny(model)


@pytest.mark.parametrize("name", list(SINGLE))
def test_single_class_passes_are_bit_identical_to_the_padded_reference(models, name):
    """A decode-only pass (query lengths 1..K + 1) is one group with the padded shapes: bit for bit, or within
    rounding where its rows go through the fused decode op (float32 on a CPU with the own kernels, OPS §11)."""
    new, old = models
    batch, next_ids = gen_pass(1, *SINGLE[name])
    fused = new.dtype == "float32" and fused_attention.AVAILABLE
    for got, want in zip(both_passes(new, batch, next_ids, 2), both_passes(old, batch, next_ids, 2)):
        if fused:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-4, err_msg=name)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("name", list(MIXED))
def test_passes_with_chunks_keep_every_argmax_of_the_padded_reference(models, name):
    """A prefill chunk alone or next to decode rows: every target and MTP argmax as the padded pass; logits and
    hidden within rounding (the CPU matmul's last bits depend on the matrix shape, and a chunk's tiles sum its
    softmax in another order, so the two are not identical)."""
    new, old = models
    batch, next_ids = gen_pass(3, *MIXED[name])
    atol = 1e-4 if new.dtype == "float32" else 1e-12   # measured: 1.2e-5 and 2.7e-14 on logits up to 16
    got, want = both_passes(new, batch, next_ids, 4), both_passes(old, batch, next_ids, 4)
    for i in (0, 2):
        np.testing.assert_array_equal(got[i].argmax(1), want[i].argmax(1), err_msg=name)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=atol, err_msg=name)


PROMPTS = ["The cat sat on the mat and", "Hello, my name is", "Once upon a time, in a land far away,", "1 2 3 4",
           "The weather today", "A B C", "She said that", "Numbers: 7, 8,", "Dear friend,", "x",
           "On Monday, Judy travels to Oslo with her old friend and"]


@pytest.mark.parametrize("k", [0, 2])
def test_engine_outputs_and_acceptance_equal_those_of_the_padded_attention(monkeypatch, k):
    """The end-to-end oracles' view (PD_MTP_FLOW §10.1, float32): with chunked prefill next to decoding rows,
    greedy tokens and the accepted tokens of every decode round are those of the padded attention."""
    passes = {"all": 0, "grouped": 0}

    class CountingAttention(fd_tiny.PagedAttention):
        def __init__(self, *args):
            super().__init__(*args)
            passes["all"] += 1
            passes["grouped"] += len(self.groups) > 1

    params = [SamplingParams(max_tokens=24 if i % 3 else 40, min_tokens=i % 4) for i in range(len(PROMPTS))]
    results = {}
    for name, attention in (("padded", PaddedPagedAttention), ("grouped", CountingAttention)):
        monkeypatch.setattr(fd_tiny, "PagedAttention", attention)
        llm = LLM(model="fd-tiny", max_num_seqs=6, block_size=8, max_model_len=128, max_num_batched_tokens=40,
                  speculative_config={"method": "mtp", "num_speculative_tokens": k} if k else None)
        results[name] = [(o.outputs.token_ids, o.metrics.accepted_per_round)
                         for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert results["grouped"] == results["padded"]
    assert passes["grouped"] >= 5, passes      # the workload does mix decode rows with prefill chunks
