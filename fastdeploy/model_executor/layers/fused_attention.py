"""Attention straight over the paged KV cache on the CPU (OPS §11: `fd_cpu_decode_attention`,
`fd_cpu_prefill_attention`, and `fd_cpu_rope_cache_write` for the rotation and the cache write before them).

A decode or verify row's attention through Paddle's ops costs about a dozen ops a layer (gather the context,
reshape, transpose, two matmuls, the mask, the softmax) whose dispatch, not their arithmetic, is most of a
batch-1 step; the op reads each context row in place, once, in float32 or bfloat16. A long prefill chunk's costs
its arithmetic: the prefill op runs it in key blocks with a running softmax through oneDNN's sgemm. Used for the
decode group and a lone prefill chunk of a pass (layers/paged_attention.py) where the CPU runs the project's
AVX-512 kernels and the model computes in float32; float64 models (the exactness tests) and other devices keep
Paddle's ops.
"""
from __future__ import annotations

import paddle

from fastdeploy.model_executor.layers.quantization.base import (CPU_KERNEL, KERNEL_DPBF16, ON_CPU, CpuOperands,
                                                                empty_float32)
from fastdeploy.model_executor.ops import _loader

AVAILABLE = ON_CPU and CPU_KERNEL == KERNEL_DPBF16


def decode_attention(q: paddle.Tensor, cache_layer: paddle.Tensor, ctx_rows: paddle.Tensor,
                     token_seq: paddle.Tensor, token_len: paddle.Tensor, scale: float) -> paddle.Tensor:
    """q [N, nh, hd] float32; cache_layer [blocks, block_size, 2, nkv, hd]; ctx_rows [S, C] int64 cache rows of each
    sequence's positions 0 .. C - 1; token i attends to ctx_rows[token_seq[i], :token_len[i]] -> [N, nh, hd]."""
    return _loader.cpu_ops().fd_cpu_decode_attention(q, cache_layer, ctx_rows, token_seq, token_len, scale)[0]


def prefill_attention(q: paddle.Tensor, cache_layer: paddle.Tensor, ctx_rows: paddle.Tensor,
                      scale: float) -> paddle.Tensor:
    """q [T, nh, hd] float32: one sequence's chunk, the queries of its context's last T positions; ctx_rows [C] int64
    cache rows of positions 0 .. C - 1 -> [T, nh, hd], causal (OPS §11.3)."""
    return _loader.cpu_ops().fd_cpu_prefill_attention(q, cache_layer, ctx_rows, scale)[0]


def rope_cache_write(qkv: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor, cache_layer: paddle.Tensor,
                     rows: paddle.Tensor, num_heads: int, interleaved: bool) -> paddle.Tensor:
    """qkv [M, (nh + 2 nkv) * hd] float32 (q | k | v heads); cos, sin [M, 1, hd] (layers/rotary.py's spread tables);
    rows [M] int64 cache rows. Writes the rotated k and v into `cache_layer` in place -> the rotated q [M, nh, hd],
    bit for bit RotaryEmbedding.rotate and KVCache.write_rows (OPS §11.2)."""
    return _loader.cpu_ops().fd_cpu_rope_cache_write(qkv, cos, sin, cache_layer, rows, num_heads, interleaved)[0]


def attention_block(x: paddle.Tensor, residual: paddle.Tensor, norm_weight: paddle.Tensor, eps: float,
                    qkv: CpuOperands, o_proj: CpuOperands, cos: paddle.Tensor, sin: paddle.Tensor,
                    cache_layer: paddle.Tensor, write_rows: paddle.Tensor, ctx_rows: paddle.Tensor,
                    token_seq: paddle.Tensor, token_len: paddle.Tensor, num_heads: int, interleaved: bool,
                    scale: float) -> tuple[paddle.Tensor, paddle.Tensor]:
    """x [M, H] float32 decode / verify rows, residual [M, H] or [0] (the first layer) -> (o_proj(attention of the
    rotated q over the cache, after writing the rotated k and v), x + residual or x), with the norm of x + residual
    the q|k|v product's input: the norm, both products, rope_cache_write and decode_attention in one op, their bits
    (OPS §13.3)."""
    out, summed = _loader.cpu_ops().fd_cpu_attention_block(
        x, residual, norm_weight, qkv.packed, qkv.scales, cos, sin, cache_layer, write_rows, ctx_rows, token_seq,
        token_len, o_proj.packed, o_proj.scales, eps, qkv.k, num_heads, interleaved, scale, qkv.kind, qkv.kernel,
        o_proj.kind, o_proj.kernel)
    return out, summed


def decoder_stack(x: paddle.Tensor, ops, cos: paddle.Tensor, sin: paddle.Tensor, caches: list[paddle.Tensor],
                  write_rows: paddle.Tensor, ctx_rows: paddle.Tensor, token_seq: paddle.Tensor,
                  token_len: paddle.Tensor, num_heads: int, scale: float) -> tuple[paddle.Tensor, paddle.Tensor]:
    """x [M, H] float32 decode / verify rows (the embeddings) through every layer of `ops` (layers/decoder.
    StackOperands), layer l over cache layer caches[l] -> the last layer's (out, residual), whose sum is the stack's
    output: each layer's attention_block then its fd_cpu_swiglu_mlp, in one op, their bits (OPS §13.4)."""
    out, residual = _loader.cpu_ops().fd_cpu_decoder_stack(
        x, empty_float32(), cos, sin, write_rows, ctx_rows, token_seq, token_len, caches, *ops.lists, ops.eps,
        ops.hidden, ops.intermediate, num_heads, ops.interleaved, scale, *ops.kinds)
    return out, residual
