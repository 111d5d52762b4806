"""fd_cpu_prefill_attention (OPS §11.3) against its float64 NumPy reference, over chunk and context lengths that the
op's query tiles (128 positions) and key blocks (256) do not divide, grouped-query heads, float32 and bfloat16
caches, rows scattered over the cache; a query row's bits independent of the chunk it is computed in; its errors."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers import fused_attention

pytestmark = pytest.mark.skipif(not fused_attention.AVAILABLE,
                                reason="the fused prefill op needs the CPU's own AVX-512 kernels")

BLOCK = 16


def reference(q, cache, ctx_rows, scale):
    """OPS §11.3's formula in float64: query t of the chunk sits at position C - T + t and sees positions 0 .. it."""
    rows = cache.reshape(-1, *cache.shape[2:]).astype(np.float64)[ctx_rows]   # [C, 2, nkv, hd]
    t_len, nh, _ = q.shape
    c, nkv = rows.shape[0], rows.shape[2]
    later = np.arange(c)[None, :] > (c - t_len + np.arange(t_len))[:, None]   # [T, C]: keys after the query
    out = np.zeros(q.shape)
    for h in range(nh):
        j = h // (nh // nkv)
        s = q[:, h].astype(np.float64) @ rows[:, 0, j].T * scale
        s[later] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = p @ rows[:, 1, j] / p.sum(axis=1, keepdims=True)
    return out


def make(rng, c, nh, nkv, hd, cache_dtype="float32"):
    """A cache holding one sequence's c positions on shuffled rows, and c queries."""
    blocks = -(-c // BLOCK) + 2
    cache = paddle.to_tensor(rng.standard_normal((blocks, BLOCK, 2, nkv, hd)).astype(np.float32)).astype(cache_dtype)
    ctx_rows = rng.permutation(blocks * BLOCK)[:c].astype(np.int64)
    return cache, ctx_rows, rng.standard_normal((c, nh, hd)).astype(np.float32)


def attend(q, cache, ctx_rows, hd):
    return fused_attention.prefill_attention(paddle.to_tensor(q), cache, paddle.to_tensor(ctx_rows),
                                             1.0 / np.sqrt(hd)).numpy()


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("nh, nkv, hd", [(9, 3, 64), (16, 2, 128), (5, 5, 80), (3, 1, 48)])
@pytest.mark.parametrize("c, t", [(1, 1), (7, 7), (129, 129), (300, 129), (600, 257), (513, 1)])
def test_op_matches_its_reference(c, t, nh, nkv, hd, cache_dtype):
    rng = np.random.default_rng(c * 7 + t + nh)
    cache, ctx_rows, q = make(rng, c, nh, nkv, hd, cache_dtype)
    got = attend(q[c - t:], cache, ctx_rows, hd)
    want = reference(q[c - t:], cache.astype("float32").numpy(), ctx_rows, 1.0 / np.sqrt(hd))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("nh, nkv", [(1, 1), (9, 3), (16, 2)])
def test_a_rows_bits_do_not_depend_on_the_chunk_it_is_computed_in(nh, nkv):
    """The prompt whole, and the same positions as later chunks of every length (a prefix-cache hit, another
    --max-num-batched-tokens, a one-row tile): the same bits."""
    rng = np.random.default_rng(nh)
    c, hd = 700, 64
    cache, ctx_rows, q = make(rng, c, nh, nkv, hd)
    whole = attend(q, cache, ctx_rows, hd)
    for start, stop in [(1, 2), (37, 166), (128, 700), (255, 512), (300, 301), (600, 700), (699, 700)]:
        part = attend(q[start:stop], cache, ctx_rows[:stop], hd)
        np.testing.assert_array_equal(part, whole[start:stop], err_msg=f"chunk {start}..{stop}")


def test_a_cache_row_outside_the_cache_is_refused_naming_the_argument():
    cache = paddle.zeros([2, BLOCK, 2, 1, 16])
    rows = paddle.to_tensor(np.array([0, 2 * BLOCK], np.int64))
    with pytest.raises(Exception, match="ctx_rows' holds row 32 of a cache of 32"):
        fused_attention.prefill_attention(paddle.zeros([1, 1, 16]), cache, rows, 0.25)


def test_more_queries_than_context_positions_are_refused():
    cache = paddle.zeros([2, BLOCK, 2, 1, 16])
    with pytest.raises(Exception, match="'q' has 3 rows; the context has 2 positions"):
        fused_attention.prefill_attention(paddle.zeros([3, 1, 16]), cache,
                                          paddle.to_tensor(np.array([0, 1], np.int64)), 0.25)
