"""fd_cpu_attention_block (OPS §13.3): a decoder layer's attention half over decode / verify rows in one op (the norm,
the q|k|v product, the rotation and cache write, the attention over the paged cache, the output product), bit for
bit the ops it stands for called one by one (fd_cpu_rms_norm, fd_cpu_linear, fd_cpu_rope_cache_write,
fd_cpu_decode_attention, fd_cpu_linear), the cache's writes included; the decoder layer taking it in a decode pass
and the separate ops in a prefill pass; its errors naming the stage."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers import fused_attention
from fastdeploy.model_executor.layers.decoder import AttentionShape, DecoderLayer
from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.paged_attention import PagedAttention
from fastdeploy.model_executor.layers.quantization import building
from fastdeploy.model_executor.layers.quantization.base import (KERNEL_DPBF16, KIND_BF16, KIND_F32, KIND_INT4,
                                                                KIND_INT8, CpuOperands, cpu_linear, cpu_pack)
from fastdeploy.model_executor.layers.quantization.weight_only import quantize
from fastdeploy.model_executor.layers.rotary import RotaryEmbedding
from fastdeploy.model_executor.layers.transformer import SwiGLU
from fastdeploy.model_executor.ops import _loader
from fastdeploy.precision import Precision, parse_quantization

pytestmark = pytest.mark.skipif(not fused_attention.AVAILABLE, reason="the op needs the CPU's own AVX-512 kernels")

EPS = 1e-6
KINDS = {"float32": KIND_F32, "bfloat16": KIND_BF16, "wint8": KIND_INT8, "wint4": KIND_INT4}
BLOCKS, BLOCK = 16, 16


def _operands(kind: str, k: int, n: int, rng) -> CpuOperands:
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    if kind in ("float32", "bfloat16"):
        return CpuOperands(cpu_pack(w, KINDS[kind], KERNEL_DPBF16), paddle.zeros([0]), k, n, KINDS[kind],
                           KERNEL_DPBF16)
    q, scale = quantize(w, 8 if kind == "wint8" else 4)
    return CpuOperands(cpu_pack(q, KINDS[kind], KERNEL_DPBF16), paddle.to_tensor(scale), k, n, KINDS[kind],
                       KERNEL_DPBF16)


def _case(kind: str, hidden: int, nh: int, nkv: int, hd: int, q_lens: list[int], cache_dtype: str, seed: int = 0):
    """Sequences with q_lens[i] query rows each at the end of its context (a decode row: 1, a verify: K + 1),
    each over its own shuffled cache rows; the cache filled at random."""
    rng = np.random.default_rng(seed)
    m = sum(q_lens)
    x, residual = (paddle.to_tensor(rng.standard_normal((m, hidden)).astype(np.float32)) for _ in range(2))
    norm_w = paddle.to_tensor(rng.uniform(0.5, 1.5, hidden).astype(np.float32))
    qkv, o_proj = _operands(kind, hidden, (nh + 2 * nkv) * hd, rng), _operands(kind, nh * hd, hidden, rng)
    ctx_len = [int(rng.integers(q + 1, 40)) for q in q_lens]
    cmax = max(ctx_len)
    cache = paddle.to_tensor(rng.standard_normal((BLOCKS, BLOCK, 2, nkv, hd)).astype(np.float32)).astype(cache_dtype)
    shuffled = rng.permutation(BLOCKS * BLOCK)
    ctx_rows = np.stack([shuffled[i * cmax:(i + 1) * cmax] for i in range(len(q_lens))]).astype(np.int64)
    token_seq = np.repeat(np.arange(len(q_lens)), q_lens).astype(np.int32)
    token_len = np.concatenate([np.arange(c - q + 1, c + 1) for q, c in zip(q_lens, ctx_len)]).astype(np.int32)
    write_rows = ctx_rows[token_seq, token_len - 1]
    angles = rng.uniform(0, 6.3, (m, 1, hd)).astype(np.float32)
    cos, sin = paddle.to_tensor(np.cos(angles)), paddle.to_tensor(np.sin(angles))
    rows = [paddle.to_tensor(a) for a in (write_rows, ctx_rows, token_seq, token_len)]
    return x, residual, norm_w, qkv, o_proj, cos, sin, cache, rows


def _op(x, residual, norm_w, qkv, o_proj, cos, sin, cache, rows, nh, interleaved=True, hidden=None):
    hd = cache.shape[-1]
    return _loader.cpu_ops().fd_cpu_attention_block(
        x, residual, norm_w, qkv.packed, qkv.scales, cos, sin, cache, *rows, o_proj.packed, o_proj.scales, EPS,
        x.shape[1] if hidden is None else hidden, nh, interleaved, 1.0 / np.sqrt(hd), qkv.kind, qkv.kernel,
        o_proj.kind, o_proj.kernel)


def _one_by_one(x, residual, norm_w, qkv, o_proj, cos, sin, cache, rows, nh, interleaved=True):
    ops = _loader.cpu_ops()
    hd = cache.shape[-1]
    if residual.shape == [0]:
        normed, summed = ops.fd_cpu_rms_norm(x, norm_w, residual, EPS)[0], x
    else:
        normed, summed = ops.fd_cpu_rms_norm(x, norm_w, residual, EPS)
    heads = cpu_linear(normed, *qkv)
    q = ops.fd_cpu_rope_cache_write(heads, cos, sin, cache, rows[0], nh, interleaved)[0]
    att = ops.fd_cpu_decode_attention(q, cache, *rows[1:], 1.0 / np.sqrt(hd))[0]
    return cpu_linear(att.reshape([x.shape[0], nh * hd]), *o_proj), summed


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("hidden, nh, nkv, hd, q_lens, interleaved", [
    (64, 4, 2, 16, [1], True),             # batch-1 decode
    (40, 6, 3, 32, [1, 1, 1, 1, 1], False),  # a batched decode; hidden and heads the 16 lanes do not divide
    (72, 8, 2, 48, [2, 3, 2], True),       # verify rows of K = 1 and 2
])
def test_the_op_is_the_ops_one_by_one(kind, cache_dtype, hidden, nh, nkv, hd, q_lens, interleaved):
    x, residual, norm_w, qkv, o_proj, cos, sin, cache, rows = _case(kind, hidden, nh, nkv, hd, q_lens, cache_dtype)
    cache_apart = cache.clone()
    out, summed = _op(x, residual, norm_w, qkv, o_proj, cos, sin, cache, rows, nh, interleaved)
    want, want_sum = _one_by_one(x, residual, norm_w, qkv, o_proj, cos, sin, cache_apart, rows, nh, interleaved)
    assert out.shape == [x.shape[0], hidden] and out.dtype == paddle.float32
    np.testing.assert_array_equal(out.numpy(), want.numpy())
    np.testing.assert_array_equal(summed.numpy(), want_sum.numpy())
    np.testing.assert_array_equal(cache.astype("float32").numpy(), cache_apart.astype("float32").numpy())


def test_the_first_layer_has_no_residual_and_passes_x_on():
    x, _, norm_w, qkv, o_proj, cos, sin, cache, rows = _case("wint8", 64, 4, 2, 16, [1, 1], "bfloat16", seed=3)
    cache_apart = cache.clone()
    out, summed = _op(x, paddle.zeros([0]), norm_w, qkv, o_proj, cos, sin, cache, rows, 4)
    want, _ = _one_by_one(x, paddle.zeros([0]), norm_w, qkv, o_proj, cos, sin, cache_apart, rows, 4)
    np.testing.assert_array_equal(out.numpy(), want.numpy())
    np.testing.assert_array_equal(summed.numpy(), x.numpy())


def test_errors_name_the_op_and_the_stage():
    x, residual, norm_w, qkv, o_proj, cos, sin, cache, rows = _case("bfloat16", 64, 4, 2, 16, [1, 1], "float32")
    args = (x, residual, norm_w, qkv, o_proj, cos, sin, cache, rows, 4)
    with pytest.raises(RuntimeError, match=r"fd_cpu_attention_block: argument 'x' must be a float32 CPU tensor "
                                           r"\[M, 63\]"):
        _op(*args, hidden=63)
    with pytest.raises(RuntimeError, match="fd_cpu_attention_block: attributes 'hidden' and 'num_heads'"):
        _op(*args[:-1], 3)
    with pytest.raises(RuntimeError, match=r"fd_cpu_attention_block \(norm\): fd_cpu_rms_norm: argument 'weight'"):
        _op(x, residual, norm_w[:63], *args[3:])
    with pytest.raises(RuntimeError, match=r"fd_cpu_attention_block \(qkv\): fd_cpu_linear: argument 'packed'"):
        _op(x, residual, norm_w, o_proj, *args[4:])
    with pytest.raises(RuntimeError, match=r"fd_cpu_attention_block \(rope_cache_write\): fd_cpu_rope_cache_write: "
                                           r"argument 'rows' holds row 256"):
        _op(*args[:8], [paddle.to_tensor(np.array([3, 256], np.int64)), *rows[1:]], 4)
    with pytest.raises(RuntimeError, match=r"fd_cpu_attention_block \(attention\): fd_cpu_decode_attention: "
                                           r"argument 'token_len' holds 99"):
        _op(*args[:8], [*rows[:3], paddle.to_tensor(np.array([5, 99], np.int32))], 4)
    with pytest.raises(RuntimeError, match=r"fd_cpu_attention_block \(o_proj\): fd_cpu_linear: argument 'packed'"):
        _op(x, residual, norm_w, qkv, qkv, *args[5:])


def test_the_registered_op_is_the_direct_call():
    x, residual, norm_w, qkv, o_proj, cos, sin, cache, rows = _case("wint4", 64, 4, 2, 16, [2, 1], "bfloat16")
    caches = [cache, cache.clone()]
    args = lambda c: (x, residual, norm_w, qkv.packed, qkv.scales, cos, sin, c, *rows, o_proj.packed,  # noqa: E731
                      o_proj.scales, EPS, 64, 4, True, 0.25, qkv.kind, qkv.kernel, o_proj.kind, o_proj.kernel)
    direct = _loader.cpu_ops().fd_cpu_attention_block(*args(caches[0]))
    registered = paddle._C_ops._run_custom_op("fd_cpu_attention_block", *args(caches[1]))
    for d, r in zip(direct, registered):
        np.testing.assert_array_equal(d.numpy(), r.numpy())
    np.testing.assert_array_equal(caches[0].astype("float32").numpy(), caches[1].astype("float32").numpy())


def _layer_and_pass(precision: Precision, q_lens: list[int], past: int):
    """A decoder layer in `precision` (random weights), its KV cache, and a PagedAttention pass of sequences with
    q_lens[i] new tokens after `past` cached positions each."""
    hidden, nh, nkv, hd = 64, 4, 2, 16
    with building(precision):
        layer = DecoderLayer(0, AttentionShape(hidden, nh, nkv, hd, False, EPS), SwiGLU(hidden, 80))
    rng = np.random.default_rng(17)
    for lin in (layer.attn.qkv, layer.attn.out, layer.mlp.gate_up, layer.mlp.down):
        lin.load_weight(rng.standard_normal((lin.in_features, lin.out_features)).astype(np.float32) / 8)
    kv = KVCache(BLOCKS, BLOCK, [(2, nkv, hd)], dtype="bfloat16" if precision.dtype == "bfloat16" else "float32")
    kv.layers[0].set_value(paddle.to_tensor(rng.standard_normal(kv.layers[0].shape).astype(np.float32))
                           .astype(kv.layers[0].dtype))
    seqs = len(q_lens)
    tables = np.arange(seqs * 2).reshape(seqs, 2)
    positions = np.concatenate([np.arange(past, past + q) for q in q_lens])
    token_seq = np.repeat(np.arange(seqs), q_lens)
    starts = np.concatenate([[0], np.cumsum(q_lens)])
    attend = PagedAttention(kv, token_seq, positions, starts, tables, num_heads=nh)
    rope = RotaryEmbedding(hd, 10000.0, "interleaved")
    cos, sin = rope.angles(paddle.to_tensor(positions), "float32")
    x, residual = (paddle.to_tensor(rng.standard_normal((len(positions), hidden)).astype(np.float32))
                   for _ in range(2))
    return layer, kv, attend, rope, cos, sin, x, residual


@pytest.mark.parametrize("q_lens", [[1], [1, 1, 1], [2, 2]])   # decode, batched decode, verify of K = 1
@pytest.mark.parametrize("dtype, quantization", [("float32", None), ("bfloat16", None), ("bfloat16", "wint8"),
                                                 ("bfloat16", "wint4")])
def test_the_decoder_layer_takes_the_op_over_decode_rows(dtype, quantization, q_lens, monkeypatch):
    precision = Precision(dtype, parse_quantization(quantization))
    layer, kv, attend, rope, cos, sin, x, residual = _layer_and_pass(precision, q_lens, past=20)
    assert layer.attn_in_one_op and attend.runs_blocks
    cache_before = kv.layers[0].clone()
    calls = []
    block = fused_attention.attention_block
    monkeypatch.setattr(fused_attention, "attention_block", lambda *a: calls.append(1) or block(*a))
    got = layer(x, cos, sin, rope, attend, residual)
    cache_after, layer.attn_in_one_op = kv.layers[0].clone(), False
    kv.layers[0].set_value(cache_before)
    want = layer(x, cos, sin, rope, attend, residual)
    assert calls == [1]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    np.testing.assert_array_equal(cache_after.astype("float32").numpy(), kv.layers[0].astype("float32").numpy())


@pytest.mark.parametrize("q_lens, past", [([12], 0), ([1, 2, 1], 20)])   # a prefill chunk; padded verify rows
def test_other_passes_keep_the_separate_ops(q_lens, past):
    layer, _, attend, *_ = _layer_and_pass(Precision("bfloat16", parse_quantization("wint8")), q_lens, past)
    assert layer.attn_in_one_op and not attend.runs_blocks


def test_plain_weights_and_a_qk_norm_keep_the_separate_ops():
    assert not DecoderLayer(0, AttentionShape(64, 4, 2, 16, False, EPS), SwiGLU(64, 80)).attn_in_one_op
    with building(Precision("bfloat16", parse_quantization("wint8"))):
        assert not DecoderLayer(0, AttentionShape(64, 4, 2, 16, True, EPS), SwiGLU(64, 80)).attn_in_one_op
