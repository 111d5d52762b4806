"""The shared layers of the checkpoint families against NumPy written from their definitions (docs/models.md
"Architectures"), without torch: GQA paged attention (query head h reads KV head h // g, HF `repeat_kv`) over
shuffled blocks with decode rows and prefill chunks in one pass, and both rotary variants (NeoX halves, ERNIE's
interleaved pairs). Each planted slip (groups in the wrong order, the other rotary variant) fails here too."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.paged_attention import PREFILL_TILE, PagedAttention
from fastdeploy.model_executor.layers.rotary import RotaryEmbedding


def _reference_attention(q, k_ctx, v_ctx, positions):
    """q [T, nh, hd] at `positions` of one sequence; k/v_ctx [C, nkv, hd] its positions 0..C-1 -> [T, nh, hd]."""
    nh, nkv = q.shape[1], k_ctx.shape[1]
    g = nh // nkv
    out = np.zeros_like(q)
    for t, pos in enumerate(positions):
        for h in range(nh):
            j = h // g
            scores = k_ctx[:pos + 1, j] @ q[t, h] / np.sqrt(q.shape[2])
            p = np.exp(scores - scores.max())
            out[t, h] = (p / p.sum()) @ v_ctx[:pos + 1, j]
    return out


def _attend_against_the_definition(rng, kv, tables, q_len, ctx_len, nh, check_groups=None):
    """Caches positions before each sequence's queries, attends the queries (PagedAttention, num_heads nh) and
    compares each sequence with _reference_attention in float64 to 1e-12. check_groups(attend) sees the plan."""
    nkv, hd = kv.layer_tails[0][1:]
    k_full = rng.standard_normal((len(q_len), int(ctx_len.max()), nkv, hd))
    v_full = rng.standard_normal((len(q_len), int(ctx_len.max()), nkv, hd))
    for s in range(len(q_len)):   # the earlier positions are already in the cache
        n = ctx_len[s] - q_len[s]
        if n:
            rows = kv.locate_rows(tables, np.full(n, s), np.arange(n))
            kv.write_rows(0, rows, paddle.to_tensor(np.stack([k_full[s, :n], v_full[s, :n]], axis=1)))
    positions = np.concatenate([np.arange(c - n, c) for n, c in zip(q_len, ctx_len)])
    seq = np.repeat(np.arange(len(q_len)), q_len)
    q = rng.standard_normal((positions.size, nh, hd))
    k = np.stack([k_full[s, p] for s, p in zip(seq, positions)])
    v = np.stack([v_full[s, p] for s, p in zip(seq, positions)])
    attend = PagedAttention(kv, seq, positions, np.concatenate([[0], np.cumsum(q_len)]), tables, num_heads=nh)
    if check_groups is not None:
        check_groups(attend)
    out = attend(0, *(paddle.to_tensor(x) for x in (q, k, v))).numpy()
    for s in range(len(q_len)):
        rows = seq == s
        want = _reference_attention(q[rows], k_full[s, :ctx_len[s]], v_full[s, :ctx_len[s]], positions[rows])
        np.testing.assert_allclose(out[rows], want, rtol=0, atol=1e-12, err_msg=f"sequence {s}")


@pytest.mark.parametrize("nh, nkv", [(4, 2), (6, 2), (4, 1), (2, 2)])
def test_gqa_paged_attention_matches_the_definition(nh, nkv):
    rng = np.random.default_rng(nh * 10 + nkv)
    # three sequences: a decode row (1 token at position 9), a prefill chunk (positions 3..8), a 2-token draft row
    q_len, ctx_len = np.array([1, 6, 2]), np.array([10, 9, 5])
    kv = KVCache(16, 4, [(2, nkv, 8)], "float64")
    tables = rng.permutation(16)[:12].reshape(3, 4).astype(np.int32)   # every sequence on shuffled blocks
    _attend_against_the_definition(rng, kv, tables, q_len, ctx_len, nh)


@pytest.mark.parametrize("nh, nkv", [(6, 2), (4, 4)])
def test_gqa_prefill_chunk_in_tiles_matches_the_definition(nh, nkv):
    """A chunk longer than PREFILL_TILE after 37 cached positions (several tiles, the last one partial), next to
    a decode row: each query sees its context and its own chunk up to itself, in float64 to 1e-12."""
    rng = np.random.default_rng(nh + nkv)
    block = 16
    q_len = np.array([PREFILL_TILE * 2 + 44, 1])
    ctx_len = q_len + np.array([37, 20])
    per_seq = -(-int(ctx_len.max()) // block)
    kv = KVCache(2 * per_seq, block, [(2, nkv, 8)], "float64")
    tables = rng.permutation(2 * per_seq).reshape(2, per_seq).astype(np.int32)

    def decode_group_then_the_chunk_in_tiles(attend):
        assert [g.past for g in attend.groups] == [-1, 37]

    _attend_against_the_definition(rng, kv, tables, q_len, ctx_len, nh, decode_group_then_the_chunk_in_tiles)


def test_query_heads_must_be_a_multiple_of_the_kv_heads():
    kv = KVCache(2, 4, [(2, 2, 8)], "float64")
    with pytest.raises(ValueError, match="'num_heads' \\(3\\) must be a positive multiple of the cache's KV heads"):
        PagedAttention(kv, np.zeros(1, np.int64), np.zeros(1, np.int64), np.array([0, 1]),
                       np.zeros((1, 1), np.int32), num_heads=3)


def _rotate_definition(x, positions, base, style):
    """x [M, heads, d]: pairs (i, i + d/2) ("neox") or (2i, 2i + 1) ("interleaved") rotated by pos * base^(-2i/d)."""
    d = x.shape[-1]
    out = x.copy()
    for m, pos in enumerate(positions):
        for i in range(d // 2):
            a, b = (i, i + d // 2) if style == "neox" else (2 * i, 2 * i + 1)
            angle = pos * base ** (-2 * i / d)
            c, s = np.cos(angle), np.sin(angle)
            out[m, :, a] = x[m, :, a] * c - x[m, :, b] * s
            out[m, :, b] = x[m, :, b] * c + x[m, :, a] * s
    return out


@pytest.mark.parametrize("style", ["neox", "interleaved"])
def test_rotary_variants_match_their_definitions(style):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 3, 8))
    positions = np.array([0, 1, 7, 100, 4095])
    rope = RotaryEmbedding(8, 500000.0, style)
    cos, sin = rope.angles(paddle.to_tensor(positions), "float64")
    got = rope.rotate(paddle.to_tensor(x), cos, sin).numpy()
    np.testing.assert_allclose(got, _rotate_definition(x, positions, 500000.0, style), rtol=0, atol=1e-12)
    other = "interleaved" if style == "neox" else "neox"
    assert not np.allclose(got, _rotate_definition(x, positions, 500000.0, other))


@pytest.mark.parametrize("style", ["neox", "interleaved"])
def test_the_spread_rotation_is_the_pairwise_formula_bit_for_bit(style):
    """rotate() = x * cos + partner(x) * sin over spread tables; the pairwise formula (a c - b s, b c + a s), in
    float32 as the model runs it, gives the same bits."""
    rng = np.random.default_rng(5)
    x = paddle.to_tensor(rng.standard_normal((7, 5, 128)).astype(np.float32))
    positions = paddle.to_tensor(np.array([0, 1, 2, 63, 255, 256, 5000]))
    rope = RotaryEmbedding(128, 500000.0, style)
    cos, sin = rope.angles(positions, "float32")
    half_cos, half_sin = (t.reshape([7, 1, 64]) for t in rope.table(positions, "float32"))
    if style == "neox":
        a, b = x[..., :64], x[..., 64:]
        want = paddle.concat([a * half_cos - b * half_sin, b * half_cos + a * half_sin], axis=-1)
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        want = paddle.stack([a * half_cos - b * half_sin, b * half_cos + a * half_sin], axis=-1).reshape(x.shape)
    np.testing.assert_array_equal(rope.rotate(x, cos, sin).numpy(), want.numpy())


def test_rotary_style_is_checked():
    with pytest.raises(ValueError, match="argument 'style' must be one of"):
        RotaryEmbedding(8, 10000.0, "glm")
