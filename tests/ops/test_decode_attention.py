"""fd_cpu_decode_attention (OPS §11.1) against its float64 NumPy reference, over the shapes its tiles do not divide:
grouped-query heads not a multiple of the query tile, head sizes not a multiple of the 64-value tile, context
lengths not a multiple of the row tile, float32 and bfloat16 caches, rows scattered over the cache; and
fd_cpu_rope_cache_write (OPS §11.2) against the Paddle ops it replaces, bit for bit."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers import fused_attention
from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.rotary import ROPE_STYLES, RotaryEmbedding

pytestmark = pytest.mark.skipif(not fused_attention.AVAILABLE,
                                reason="the fused decode op needs the CPU's own AVX-512 kernels")

BLOCK = 16
LENGTHS = (1, 2, 3, 5, 17, 33, 64, 71)


def reference(q, cache, ctx_rows, token_seq, token_len, scale):
    """OPS §11.1's formula in float64 over the cache's values."""
    rows = cache.reshape(-1, *cache.shape[2:]).astype(np.float64)     # [rows, 2, nkv, hd]
    n, nh, hd = q.shape
    nkv = cache.shape[3]
    out = np.zeros((n, nh, hd))
    for i in range(n):
        r = ctx_rows[token_seq[i], :token_len[i]]
        for h in range(nh):
            j = h // (nh // nkv)
            s = rows[r, 0, j] @ q[i, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[i, h] = p @ rows[r, 1, j] / p.sum()
    return out


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("nh, nkv, hd", [(16, 2, 128), (6, 2, 80), (3, 1, 48), (5, 5, 16), (12, 1, 256)])
def test_op_matches_its_reference_over_shapes_the_tiles_do_not_divide(nh, nkv, hd, cache_dtype):
    rng = np.random.default_rng(nh * 1000 + hd)
    cmax = max(LENGTHS)
    blocks = -(-cmax * 2 // BLOCK) + 1
    cache = paddle.to_tensor(rng.standard_normal((blocks, BLOCK, 2, nkv, hd)).astype(np.float32)).astype(cache_dtype)
    # two sequences over disjoint, shuffled cache rows
    shuffled = rng.permutation(blocks * BLOCK)
    ctx_rows = np.stack([shuffled[:cmax], shuffled[cmax:2 * cmax]]).astype(np.int64)
    token_seq = np.array([i % 2 for i in range(len(LENGTHS))], np.int32)
    token_len = np.array(LENGTHS, np.int32)
    q = rng.standard_normal((len(LENGTHS), nh, hd)).astype(np.float32)
    scale = 1.0 / np.sqrt(hd)
    got = fused_attention.decode_attention(paddle.to_tensor(q), cache, paddle.to_tensor(ctx_rows),
                                           paddle.to_tensor(token_seq), paddle.to_tensor(token_len), scale).numpy()
    want = reference(q, cache.astype("float32").numpy(), ctx_rows, token_seq, token_len, scale)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # a row's output is its own: the same token alone gives the same bits
    alone = fused_attention.decode_attention(paddle.to_tensor(q[-1:]), cache, paddle.to_tensor(ctx_rows),
                                             paddle.to_tensor(token_seq[-1:]), paddle.to_tensor(token_len[-1:]),
                                             scale).numpy()
    np.testing.assert_array_equal(alone[0], got[-1])


def test_a_cache_row_outside_the_cache_is_refused_naming_the_argument():
    cache = paddle.zeros([2, BLOCK, 2, 1, 16])
    rows = paddle.to_tensor(np.array([[0, 2 * BLOCK]], np.int64))
    with pytest.raises(Exception, match="ctx_rows' holds row 32 of a cache of 32"):
        fused_attention.decode_attention(paddle.zeros([1, 1, 16]), cache, rows, paddle.to_tensor(np.zeros(1, np.int32)),
                                         paddle.to_tensor(np.array([2], np.int32)), 0.25)


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("style", ROPE_STYLES)
@pytest.mark.parametrize("nh, nkv, hd", [(16, 2, 128), (6, 3, 80), (2, 2, 2)])
def test_rope_cache_write_is_the_rotation_and_the_cache_write_bit_for_bit(nh, nkv, hd, style, cache_dtype):
    """OPS §11.2: q, and the cache rows written, equal RotaryEmbedding.rotate then KVCache.write_rows exactly."""
    rng = np.random.default_rng(hd + nh)
    m, blocks = 5, 4
    rope = RotaryEmbedding(hd, 10000.0, style)
    positions = paddle.to_tensor(rng.integers(0, 200, m).astype(np.int64))
    cos, sin = rope.angles(positions, "float32")
    qkv = paddle.to_tensor(rng.standard_normal((m, (nh + 2 * nkv) * hd)).astype(np.float32))
    rows = paddle.to_tensor(rng.permutation(blocks * BLOCK)[:m].astype(np.int64))
    fused, plain = (KVCache(blocks, BLOCK, [(2, nkv, hd)], cache_dtype) for _ in range(2))
    q = fused_attention.rope_cache_write(qkv, cos, sin, fused.layers[0], rows, nh, style == "interleaved")
    heads = rope.rotate(qkv.reshape([m, nh + 2 * nkv, hd])[:, :nh + nkv], cos, sin)
    plain.write_rows(0, rows, paddle.stack([heads[:, nh:], qkv.reshape([m, nh + 2 * nkv, hd])[:, nh + nkv:]], axis=1))
    np.testing.assert_array_equal(q.numpy(), heads[:, :nh].numpy())
    np.testing.assert_array_equal(fused.layers[0].astype("float32").numpy(), plain.layers[0].astype("float32").numpy())
