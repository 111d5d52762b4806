"""Grouped paged attention (layers/paged_attention.py, docs/design.md §3) against the padded reference
(tests/models/padded_attention_ref.py): bit for bit on every padded group, on whole decode-only passes, and on the
cache it writes; within rounding on lone prefill chunks (attended in tiles) and on mixed passes; the context always
comes from the blocks of the block table."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers import fused_attention
from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.paged_attention import (DECODE_MAX_QUERY, PREFILL_TILE, PagedAttention,
                                                               plan_groups)

from .padded_attention_ref import PaddedPagedAttention

NH, HD = 4, 32


@dataclass
class Step:
    """One attention pass: sequence i queries its last q_len[i] positions of ctx_len[i] (q_len 0: idle)."""

    kv: KVCache
    tables: np.ndarray                 # [S, NB] int32, shuffled block ids
    q_len: np.ndarray                  # [S]
    ctx_len: np.ndarray                # [S]
    q: paddle.Tensor                   # [N, NH, HD], and k, v likewise
    k: paddle.Tensor
    v: paddle.Tensor

    def args(self, seqs: np.ndarray | None = None) -> tuple:
        """(kv, token_seq, positions, seq_starts, block_tables) of the pass, or of only sequences `seqs`."""
        seqs = np.arange(self.q_len.size) if seqs is None else seqs
        q_len, ctx_len = self.q_len[seqs], self.ctx_len[seqs]
        positions = np.concatenate([np.arange(c - n, c) for n, c in zip(q_len, ctx_len)]).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int64)
        return self.kv, np.repeat(np.arange(seqs.size), q_len), positions, starts, self.tables[seqs]

    def rows(self, seqs: np.ndarray) -> np.ndarray:
        """Packed token rows of sequences `seqs` in this pass."""
        starts = np.concatenate([[0], np.cumsum(self.q_len)])
        return np.concatenate([np.arange(starts[s], starts[s + 1]) for s in seqs]).astype(np.int64)

    def take(self, seqs: np.ndarray) -> tuple[paddle.Tensor, ...]:
        index = paddle.to_tensor(self.rows(seqs))
        return tuple(paddle.gather(t, index) for t in (self.q, self.k, self.v))

    def fresh_kv(self) -> KVCache:
        """A copy of the cache as it was before the pass (attention writes the pass's K/V in place)."""
        copy = KVCache(self.kv.num_blocks, self.kv.block_size, self.kv.layer_tails, self.kv.dtype)
        copy.layers = [t.clone() for t in self.kv.layers]
        return copy


def gen_step(seed: int, dtype: str, decode: int, k: int, chunks: tuple[int, ...], block: int,
             idle: int = 2) -> Step:
    """Seeded pass: `decode` rows querying 1..k + 1 tokens at contexts 1..300, prefill chunks of the given sizes
    (each after 0..100 earlier prompt positions), `idle` sequences without tokens, all in shuffled order, every
    sequence on its own shuffled blocks; cache and q/k/v standard normal."""
    rng = np.random.default_rng(seed)
    q_dec = rng.integers(1, k + 2, decode)
    q_len = np.concatenate([q_dec, np.asarray(chunks, np.int64), np.zeros(idle, np.int64)])
    ctx_len = np.concatenate([q_dec + rng.integers(0, 300, decode),
                              np.asarray(chunks, np.int64) + rng.integers(0, 101, len(chunks)), rng.integers(1, 50, idle)])
    order = rng.permutation(q_len.size)
    q_len, ctx_len = q_len[order].astype(np.int64), ctx_len[order].astype(np.int64)
    per_seq = -(-int(ctx_len.max()) // block)
    num_blocks = per_seq * q_len.size + 5
    tables = rng.permutation(num_blocks)[:per_seq * q_len.size].reshape(q_len.size, per_seq).astype(np.int32)
    kv = KVCache(num_blocks, block, [(2, NH, HD)], dtype)
    kv.layers[0] = paddle.to_tensor(rng.standard_normal(kv.layers[0].shape).astype(dtype))
    n = int(q_len.sum())
    q, kk, v = (paddle.to_tensor(rng.standard_normal((n, NH, HD)).astype(dtype)) for _ in range(3))
    return Step(kv, tables, q_len, ctx_len, q, kk, v)


# name: (decode rows, K, prefill chunk sizes, block size)
MIXED = {"one-chunk-k1": (31, 1, (256,), 16), "awkward-chunks-k3": (12, 3, (17, 54, 97), 4),
         "short-chunk-k8": (9, 8, (10,), 5), "chunks-only": (0, 1, (54, 17), 4), "k0": (20, 0, (97,), 16),
         "short-chunks-k1": (5, 1, (12, 20, 24, 31, 40), 4), "long-chunks-k1": (6, 1, (300, 300, 129), 8)}
SINGLE = {"decode-only-k2": (25, 2, (), 4), "decode-only-k8": (7, 8, (), 16), "batch-1-decode": (1, 0, (), 16),
          "one-chunk-17": (0, 1, (17,), 4), "one-chunk-97": (0, 1, (97,), 16), "one-chunk-300": (0, 1, (300,), 16)}


def _run(step: Step, kv: KVCache, attention_cls, seqs: np.ndarray | None = None):
    args = step.args(seqs)
    attention = attention_cls(kv, *args[1:])
    q, k, v = step.take(seqs) if seqs is not None else (step.q, step.k, step.v)
    return attention, attention(0, q, k, v).numpy()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(MIXED))
def test_every_group_equals_the_padded_reference_on_its_sequences_alone(name, dtype):
    """Each padded group's rows are bit for bit what the padded algorithm gives on a pass of only that group's
    sequences, a lone prefill chunk's and the fused decode rows' (float32 on a CPU with the own kernels) within
    rounding (ROUNDING: another order of the same sums) and without a mask; the pass writes the same cache; no
    group holding a decode row is padded past DECODE_MAX_QUERY."""
    decode, k, chunks, block = MIXED[name]
    for seed in range(3):
        step = gen_step(seed, dtype, decode, k, chunks, block)
        attention, out = _run(step, step.kv, PagedAttention)
        covered = np.concatenate(attention.group_seqs)
        assert np.array_equal(np.sort(covered), np.flatnonzero(step.q_len)), name
        for group, seqs in zip(attention.groups, attention.group_seqs):
            if step.q_len[seqs].min() <= DECODE_MAX_QUERY:
                assert group.q <= DECODE_MAX_QUERY, name
            _, want = _run(step, step.fresh_kv(), PaddedPagedAttention, seqs)
            if group.past >= 0:
                assert group.bias is None and seqs.size == 1, name
            if group.past >= 0 or group.ctx_rows is not None:   # a tiled chunk, or decode rows through the fused op
                np.testing.assert_allclose(out[step.rows(seqs)], want, rtol=0, atol=ROUNDING[dtype],
                                           err_msg=f"{name} seed {seed}")
            else:
                np.testing.assert_array_equal(out[step.rows(seqs)], want, err_msg=f"{name} seed {seed}")
        reference_kv = step.fresh_kv()
        _run(step, reference_kv, PaddedPagedAttention)
        np.testing.assert_array_equal(step.kv.layers[0].numpy(), reference_kv.layers[0].numpy())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(SINGLE))
def test_a_single_class_pass_equals_the_padded_reference(name, dtype):
    """Decode-only passes (mixed query lengths 1..K + 1, so some rows are padded) form one group with the padded
    algorithm's shapes: the whole output is identical (within rounding where the fused decode op runs). One-chunk
    passes form one group attended in tiles: equal within rounding."""
    decode, k, chunks, block = SINGLE[name]
    for seed in range(3):
        step = gen_step(10 + seed, dtype, decode, k, chunks, block)
        want_kv = step.fresh_kv()
        attention, got = _run(step, step.kv, PagedAttention)
        _, want = _run(step, want_kv, PaddedPagedAttention)
        assert len(attention.groups) == 1
        if chunks or attention.groups[0].ctx_rows is not None:
            np.testing.assert_allclose(got, want, rtol=0, atol=ROUNDING[dtype], err_msg=f"{name} seed {seed}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{name} seed {seed}")


# attention outputs are O(1) here: about 100 ulp
ROUNDING = {"float32": 1e-5, "float64": 1e-13}


@pytest.mark.parametrize("dtype,atol", list(ROUNDING.items()))
def test_a_mixed_pass_differs_from_the_padded_reference_only_by_rounding(dtype, atol):
    """Over the whole mixed pass the grouped and padded outputs differ only in the last bits (the CPU matmul
    rounds a row differently for another matrix shape): attention outputs are O(1) here, so atol is ~100 ulp."""
    for name, (decode, k, chunks, block) in MIXED.items():
        step = gen_step(20, dtype, decode, k, chunks, block)
        want_kv = step.fresh_kv()
        _, got = _run(step, step.kv, PagedAttention)
        _, want = _run(step, want_kv, PaddedPagedAttention)
        np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=name)


def in_dtype(kv: KVCache, cache_dtype: str) -> KVCache:
    """kv itself (float32), or a bfloat16 cache holding its values rounded."""
    if cache_dtype == "float32":
        return kv
    bf16 = KVCache(kv.num_blocks, kv.block_size, [(2, NH, HD)], "bfloat16")
    bf16.write_rows(0, paddle.arange(kv.num_blocks * kv.block_size), kv.layers[0].reshape([-1, 2, NH, HD]))
    return bf16


@pytest.mark.skipif(not fused_attention.AVAILABLE, reason="the fused decode op needs the CPU's own AVX-512 kernels")
@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
def test_fused_decode_rows_equal_paddles_ops_and_do_not_depend_on_the_batch(cache_dtype, monkeypatch):
    """OPS §11: decode / verify rows through fd_cpu_decode_attention equal the Paddle-op path over the same cache
    (float32 or bfloat16) within rounding, and each sequence's rows are bit for bit those of a pass of it alone."""
    step = gen_step(40, "float32", 9, 2, (), 4)
    kv = in_dtype(step.fresh_kv(), cache_dtype)
    attention, fused = _run(step, kv, PagedAttention)
    assert attention.groups[0].ctx_rows is not None
    for s in np.flatnonzero(step.q_len):
        _, alone = _run(step, kv, PagedAttention, np.array([s]))
        np.testing.assert_array_equal(fused[step.rows([s])], alone)
    monkeypatch.setattr(fused_attention, "AVAILABLE", False)
    plain_attention, plain = _run(step, kv, PagedAttention)
    assert plain_attention.groups[0].ctx_rows is None
    np.testing.assert_allclose(fused, plain, rtol=0, atol=ROUNDING["float32"])


@pytest.mark.skipif(not fused_attention.AVAILABLE, reason="the fused prefill op needs the CPU's own AVX-512 kernels")
@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
def test_a_lone_prefill_chunk_through_the_fused_op_equals_paddles_tiles(cache_dtype, monkeypatch):
    """OPS §11.3: a chunk alone in its group (after some cached context) is attended by
    fd_cpu_prefill_attention over the cache in place, within rounding of transformer.chunk_attention's tiles."""
    for chunks in [(300,), (129,)]:
        step = gen_step(50 + chunks[0], "float32", 0, 1, chunks, 8, idle=0)
        kv = in_dtype(step.fresh_kv(), cache_dtype)
        attention, fused = _run(step, kv, PagedAttention)
        group = attention.groups[0]
        assert group.past >= 0 and group.ctx_rows is not None and group.k_vectors is None
        monkeypatch.setattr(fused_attention, "AVAILABLE", False)
        plain_attention, plain = _run(step, kv, PagedAttention)
        monkeypatch.undo()
        assert plain_attention.groups[0].ctx_rows is None
        np.testing.assert_allclose(fused, plain, rtol=0, atol=ROUNDING["float32"])


@pytest.mark.skipif(not fused_attention.AVAILABLE, reason="the fused prefill op needs the CPU's own AVX-512 kernels")
def test_short_prefill_chunks_are_each_attended_alone_by_the_fused_op(monkeypatch):
    """With the CPU ops every prefill chunk is its own group, however short (no padded group of chunks): the pass
    fuses the rotation and the cache write, each sequence's rows are bit for bit those of a pass of it alone, and
    the whole pass is within rounding of Paddle's padded groups."""
    step = gen_step(60, "float32", 5, 1, (12, 20, 24, 31, 40), 4)
    kv = step.fresh_kv()
    attention, fused = _run(step, kv, PagedAttention)
    assert attention.fuses_rope and all(g.ctx_rows is not None for g in attention.groups)
    assert sorted(len(seqs) for seqs in attention.group_seqs) == [1, 1, 1, 1, 1, 5]
    for s in np.flatnonzero(step.q_len > DECODE_MAX_QUERY):
        _, alone = _run(step, step.fresh_kv(), PagedAttention, np.array([s]))
        np.testing.assert_array_equal(fused[step.rows([s])], alone)
    monkeypatch.setattr(fused_attention, "AVAILABLE", False)
    plain_attention, plain = _run(step, step.fresh_kv(), PagedAttention)
    assert any(len(seqs) > 1 and step.q_len[seqs].min() > DECODE_MAX_QUERY for seqs in plain_attention.group_seqs)
    np.testing.assert_allclose(fused, plain, rtol=0, atol=ROUNDING["float32"])


def test_each_sequence_reads_only_the_blocks_of_its_block_table():
    """Overwrite the first block of one decode row's context and of one prefill chunk's earlier context (blocks
    the pass does not write): exactly those two sequences' outputs move, in a pass that groups them apart."""
    step = gen_step(30, "float64", 6, 2, (54, 54, 54), 4)
    _, clean = _run(step, step.fresh_kv(), PagedAttention)
    active = np.flatnonzero(step.q_len)
    earlier = step.ctx_len - step.q_len >= step.kv.block_size      # position 0..block-1 precede every query
    chunk = active[(step.q_len[active] == 54) & earlier[active]][0]
    row = active[(step.q_len[active] <= 3) & earlier[active]][0]
    corrupt = step.fresh_kv()
    for seq in (row, chunk):
        block = int(step.tables[seq, 0])
        corrupt.layers[0][block] = paddle.zeros_like(corrupt.layers[0][block])
    _, moved = _run(step, corrupt, PagedAttention)
    changed = {int(s) for s in active if np.abs(moved[step.rows([s])] - clean[step.rows([s])]).max() > 1e-6}
    assert changed == {int(row), int(chunk)}


def test_plan_groups_keeps_decode_rows_together_and_merges_only_cheap_chunks():
    """Every sequence in exactly one group; decode rows (<= DECODE_MAX_QUERY) one group whatever their contexts;
    prefill chunks share a group only while that adds fewer padded slots than GROUP_COST_SLOTS, so a short chunk
    joins a similar one, never a 256-token one, and many equal short prompts are one group."""
    q_len = np.array([2, 256, 1, DECODE_MAX_QUERY, DECODE_MAX_QUERY + 1, 17, 2])
    groups = plan_groups(q_len, q_len + np.array([300, 100, 5, 100, 100, 100, 40]))
    assert [g.tolist() for g in groups] == [[0, 2, 3, 6], [4, 5], [1]]
    assert [g.tolist() for g in plan_groups(np.full(25, 20), np.full(25, 20))] == [list(range(25))]
    assert [g.tolist() for g in plan_groups(np.array([2] * 31 + [256]), np.r_[np.arange(100, 410, 10), 256])] == [
        list(range(31)), [31]]
    assert plan_groups(np.zeros(0, np.int64), np.zeros(0, np.int64)) == []


def test_with_chunks_alone_every_prefill_chunk_is_a_group_and_decode_rows_stay_one():
    q_len = np.array([2, 256, 1, DECODE_MAX_QUERY, DECODE_MAX_QUERY + 1, 17, 2, 17])
    groups = plan_groups(q_len, q_len + 10, chunks_alone=True)
    assert [g.tolist() for g in groups] == [[0, 2, 3, 6], [1], [4], [5], [7]]


def test_a_chunk_longer_than_a_tile_is_a_group_of_its_own():
    """Chunks over PREFILL_TILE are never padded into a shared group, even where that would add no slot (equal
    lengths); the shorter chunks still merge as before."""
    q_len = np.array([2, PREFILL_TILE + 1, PREFILL_TILE + 1, 20, 20])
    groups = [g.tolist() for g in plan_groups(q_len, q_len + 10)]
    assert sorted(groups) == [[0], [1], [2], [3, 4]]
