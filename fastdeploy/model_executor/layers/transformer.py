"""Transformer building blocks of fd-tiny: RMSNorm, rotary embedding, attention projections, SwiGLU, one block.

Attention itself is delegated to an `attend(layer, q, k, v)` callable so the same block runs over a paged KV
cache at inference (layers/paged_attention.py) and over dense causal sequences in training.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn
from paddle.incubate.nn.functional import fused_rms_norm

from fastdeploy.model_executor.layers import cpu_rms_norm, quantization
from fastdeploy.model_executor.layers.quantization.base import empty_float32
from fastdeploy.model_executor.ops import _loader

# attend(layer index, q, k, v) -> out, all [M, num_heads, head_dim]
AttendFn = Callable[[int, paddle.Tensor, paddle.Tensor, paddle.Tensor], paddle.Tensor]


class RMSNorm(nn.Layer):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = self.create_parameter([hidden_size], default_initializer=nn.initializer.Constant(1.0))

    def forward(self, x: paddle.Tensor, residual: paddle.Tensor | None = None):
        """[..., H] -> [..., H], over the last axis. With `residual`: (the norm of x + residual, x + residual), the
        sum being the plain elementwise one (bit for bit), so that a decoder layer's residual add and the next
        norm are one op."""
        if x.dtype == paddle.float32 and cpu_rms_norm.AVAILABLE and self.weight.dtype == paddle.float32:
            out, summed = cpu_rms_norm.rms_norm(x, self.weight, self.eps, residual)   # Paddle's kernel's bits
            return out if residual is None else (out, summed)
        if x.dtype == paddle.float32:
            # Paddle's fused kernel: one op where the formula below is six, and each row normalized alone (its
            # result does not depend on the other rows); it has no float64 kernel
            if residual is None:
                return fused_rms_norm(x, self.weight, None, self.eps, x.ndim - 1)[0]
            return fused_rms_norm(x, self.weight, None, self.eps, x.ndim - 1, residual=residual)
        if residual is None:
            return x * paddle.rsqrt(paddle.mean(x * x, axis=-1, keepdim=True) + self.eps) * self.weight
        x = x + residual
        return self(x), x


def rope_cos_sin(positions: paddle.Tensor, head_dim: int, base: float, dtype: str) -> tuple[paddle.Tensor, ...]:
    """cos, sin [M, head_dim / 2] for int64 positions [M] (frequencies base^(-2i / head_dim))."""
    inv_freq = paddle.exp(paddle.arange(0, head_dim, 2, dtype="float64") * (-math.log(base) / head_dim))
    angles = positions.astype("float64")[:, None] * inv_freq[None, :]
    return paddle.cos(angles).astype(dtype), paddle.sin(angles).astype(dtype)


class RopeTable:
    """rope_cos_sin of positions 0 .. n - 1, computed once and grown on demand; a pass gathers its rows.

    At batch 1 a forward pass is bound by the number of Paddle ops, and recomputing the angles costs eight ops per
    pass. Every op of rope_cos_sin is elementwise, so a row of the table equals rope_cos_sin of that position
    alone (checked bit for bit for positions 0 .. 4095, singly, in pairs and as prompts, float32 and float64).
    """

    def __init__(self, head_dim: int, base: float):
        self.head_dim, self.base = head_dim, base
        self.cos: paddle.Tensor | None = None    # [n, 1, 1, head_dim / 2]: broadcasts over (q or k, head)
        self.sin: paddle.Tensor | None = None

    def __call__(self, positions: paddle.Tensor, dtype: paddle.dtype | str) -> tuple[paddle.Tensor, paddle.Tensor]:
        """cos, sin [M, 1, 1, head_dim / 2] of int64 positions [M], in dtype (the model's parameter dtype)."""
        cos, sin = self.tables(positions, dtype)
        return paddle.gather(cos, positions), paddle.gather(sin, positions)

    def tables(self, positions: paddle.Tensor, dtype: paddle.dtype | str) -> tuple[paddle.Tensor, paddle.Tensor]:
        """The whole tables [n, 1, 1, head_dim / 2], grown to cover `positions`; a new pair of tensors whenever
        they grow or change dtype."""
        if isinstance(dtype, str):   # "float32" -> paddle.float32: the cached table's dtype compares equal
            dtype = getattr(paddle, dtype)
        needed = int(positions.max()) + 1 if positions.shape[0] else 0
        if self.cos is None or self.cos.shape[0] < needed or self.cos.dtype != dtype:
            size = max(needed, 2 * (self.cos.shape[0] if self.cos is not None else 0), 256)
            cos, sin = rope_cos_sin(paddle.arange(size, dtype="int64"), self.head_dim, self.base, dtype)
            self.cos, self.sin = cos.reshape([size, 1, 1, -1]), sin.reshape([size, 1, 1, -1])
        return self.cos, self.sin


def apply_rope(x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
    """Rotate the two halves of each head of x [M, 2, nh, hd] (q and k) by the angles of cos/sin, [M, 2, nh, hd / 2]
    or broadcast to it."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return paddle.concat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def attention_core(q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, bias: paddle.Tensor) -> paddle.Tensor:
    """Softmax attention, head-major. q [nh, S, Tq, hd], k/v [nh, S, C, hd], bias [nh, S, Tq, C] in q's dtype: 0
    where the query may attend, -inf where not (every row needs one 0; callers build it once per pass). Returns
    [nh, S, Tq, hd].

    Head-major so that both products are plain batched matmuls over contiguous memory: Paddle's CPU matmul copies
    a transposed view of its inputs first, and for the context (the large operand) that copy cost about ten times
    the product (docs/benchmarks.md "Decode at memory speed"); so k/v should arrive contiguous, while q (small) may
    be a view. The bias has the scores' full shape for the same reason: a broadcast add costs ~30 times an
    elementwise one on this CPU. Additive rather than a where(): a finite score plus 0 is that score and plus -inf
    is -inf, so the softmax input is the masked scores exactly."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = paddle.matmul(q, k, transpose_y=True) * scale                # [nh, S, Tq, C]
    return paddle.matmul(F.softmax(scores + bias, axis=-1), v)


def triangle_bias(nkv: int, group: int, n: int, dtype: str) -> paddle.Tensor:
    """chunk_attention's bias of an n-row tile over its own n keys, [nkv, group * n, n]: 0 on and below the
    diagonal, -inf above, repeated for each of the `group` query heads of a KV head (full shape: see
    attention_core on broadcast adds)."""
    tri = np.where(np.tril(np.ones((n, n), bool)), 0.0, -np.inf).astype(dtype)
    return paddle.to_tensor(np.broadcast_to(tri, (nkv, group, n, n)).reshape(nkv, group * n, n))


def chunk_attention(q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, past: int, tile: int,
                    triangle: Callable[[int], paddle.Tensor]) -> paddle.Tensor:
    """Causal attention of one sequence's prefill chunk over its whole context, query tile by query tile.

    q [T, nh, hd]: the chunk's queries, at positions past .. past + T - 1; k, v [nkv, past + T, hd], contiguous,
    head-major: positions 0 .. past + T - 1 of the sequence (the cached context, then the chunk); nh = g * nkv,
    query head j * g + i reads KV head j. `triangle(n)` is triangle_bias(nkv, g, n) in q's dtype (the caller keeps
    one per tile size for the whole pass). Returns [T, nh, hd].

    The queries of a tile at positions a .. a + n - 1 see keys 0 .. a + n - 1 only: keys before a without a mask,
    the tile's own n keys through the triangle added in place to the last n columns of its scores. So no [T, C]
    mask exists, the work is the causal half of T x C (no scores are computed for keys after a tile), and the
    scores held at once are one tile's, [nkv, g * n, a + n]. The g query heads of a KV head are one batched matmul
    against that head's keys, never repeated in memory. The scale is folded into q (a [T, nh, hd] product, not a
    pass over the scores): Paddle's CPU elementwise ops cost about as much per element as the softmax itself.
    """
    t, nh, hd = q.shape
    nkv = k.shape[0]
    g = nh // nkv
    q = q * (1.0 / math.sqrt(hd))
    outs = []
    for start in range(0, t, tile):
        n = min(tile, t - start)
        end = past + start + n
        # [n, nkv, g, hd] -> [nkv, g * n, hd]: rows (i, t) of KV head j, a copy of the (small) tile
        qt = q[start:start + n].reshape([n, nkv, g, hd]).transpose([1, 2, 0, 3]).reshape([nkv, g * n, hd])
        scores = paddle.matmul(qt, k[:, :end], transpose_y=True)             # [nkv, g * n, end]
        scores[:, :, end - n:] = scores[:, :, end - n:] + triangle(n)
        out = paddle.matmul(F.softmax(scores, axis=-1), v[:, :end])           # [nkv, g * n, hd]
        outs.append(out.reshape([nkv, g, n, hd]).transpose([2, 0, 1, 3]).reshape([n, nh, hd]))
    return outs[0] if len(outs) == 1 else paddle.concat(outs)


def heads_first(x: paddle.Tensor) -> paddle.Tensor:
    """[S, T, nh, hd] -> [nh, S, T, hd] (a view)."""
    return x.transpose([2, 0, 1, 3])


def heads_last(x: paddle.Tensor) -> paddle.Tensor:
    """attention_core's [nh, S, T, hd] -> [S * T, nh, hd], packed rows again (one copy of the small output)."""
    nh, s, t, hd = x.shape
    return x.transpose([1, 2, 0, 3]).reshape([s * t, nh, hd])


def mask_bias(mask: np.ndarray, dtype: str) -> paddle.Tensor:
    """The additive bias of attention_core from a bool mask (True = may attend), same shape."""
    return paddle.to_tensor(np.where(mask, 0.0, -np.inf).astype(dtype))


class Linear(nn.Layer):
    """y = x @ W, W [in, out], without bias. How W is stored and multiplied is the LinearMethod that the precision
    being built chooses for the layer's kind (layers/quantization/): outside `quantization.building`, a float32
    parameter `weight` created as nn.Linear creates its own and one paddle.matmul (F.linear reads a global flag on
    every call, which at batch 1 costs about a third of the small matmul itself)."""

    def __init__(self, in_features: int, out_features: int, kind: str = "dense"):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.method = quantization.method_for(kind)
        self.method.create(self)

    def load_weight(self, weight: np.ndarray) -> None:
        """The checkpoint's [in, out] values, stored as the method stores them."""
        self.method.load(self, weight)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:  # [M, in] -> [M, out]
        return self.method.apply(self, x)


class Embedding(nn.Layer):
    """The token table [V, H], stored in the precision's dtype for unquantized weights (bf16 halves it), looked up
    into the activations' dtype."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        dtype = quantization.current_precision().dtype
        self.weight = self.create_parameter([num_embeddings, embedding_dim],
                                            dtype=dtype if dtype in ("bfloat16", "float16") else "float32")

    _tied: list | None = None   # [the head Linear] once tied (a list: not registered as a sublayer twice)

    @property
    def is_tied(self) -> bool:
        return self._tied is not None

    def tie_to(self, head: Linear) -> bool:
        """Tied embeddings held once: when the head's storage gives its columns exactly (float32, and bf16 in the
        CPU's own layout; not quantized heads), drop this layer's own [V, H] copy and look rows up as columns of
        the head. Returns whether it did. Then the head alone is loaded (load_weight here refuses)."""
        if not head.method.gives_columns or [head.in_features, head.out_features] != list(self.weight.shape)[::-1]:
            return False
        delattr(self, "weight")
        self._tied = [head]
        return True

    def load_weight(self, table: np.ndarray) -> None:
        if self.is_tied:
            raise RuntimeError("embedding tied to the head: load the head")
        if tuple(self.weight.shape) != table.shape:   # a model-side bug: the loader checked the checkpoint's shapes
            raise RuntimeError(f"embedding of shape {list(self.weight.shape)} given {list(table.shape)}")
        self.weight.set_value(paddle.to_tensor(np.asarray(table)).astype(self.weight.dtype))

    def forward(self, ids: paddle.Tensor) -> paddle.Tensor:  # [M] int64 -> [M, H]
        if self.is_tied:   # column j of the head's [H, V] is row j of the table: exact, no arithmetic
            head = self._tied[0]
            out = head.method.columns(head, ids)
        else:
            out = F.embedding(ids, self.weight)
        return out.astype("float32") if out.dtype in (paddle.bfloat16, paddle.float16) else out


def stored_weight_bytes(layer: nn.Layer) -> int:
    """Bytes of a layer's weights as stored: each Linear as its method stores it, every other parameter whole."""
    total = 0
    for sub in layer.sublayers(include_self=True):
        if isinstance(sub, Linear):
            total += sub.method.stored_bytes(sub)
        else:
            total += sum(int(p.numel()) * p.element_size() for p in sub.parameters(include_sublayers=False))
    return total


def products_in_one_op(*linears: Linear) -> bool:
    """Whether the products of `linears` can run inside one CPU op (`swiglu_op`, fused_attention.attention_block):
    each is fd_cpu_linear, on a CPU with the project's AVX-512 kernels."""
    return cpu_rms_norm.AVAILABLE and all(lin.method.cpu_operands(lin) is not None for lin in linears)


def swiglu_op(gate_up: Linear, down: Linear, x: paddle.Tensor, norm: RMSNorm | None = None,
              residual: paddle.Tensor | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
    """fd_cpu_swiglu_mlp (OPS §13.1), where products_in_one_op: (down(swiglu(gate_up(h))), x + residual) with h
    = norm(x + residual), or h = x without a norm (and [0] for the sum). The kernels of the norm and the products
    in one op, without the host's code between them, and a vectorized SwiGLU within a few ulp of Paddle's."""
    g, d = gate_up.method.cpu_operands(gate_up), down.method.cpu_operands(down)
    empty = empty_float32()
    norm_weight, eps = (empty, 0.0) if norm is None else (norm.weight, norm.eps)
    out, summed = _loader.cpu_ops().fd_cpu_swiglu_mlp(
        x, empty if residual is None else residual, norm_weight, g.packed, g.scales, d.packed, d.scales, eps,
        g.k, d.k, g.kind, g.kernel, d.kind, d.kernel)
    return out, summed


class SwiGLU(nn.Layer):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up = Linear(hidden_size, 2 * intermediate_size)
        self.down = Linear(intermediate_size, hidden_size)
        self.in_one_op = products_in_one_op(self.gate_up, self.down)   # the methods are chosen: known now

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:  # [M, H] -> [M, H]
        if self.in_one_op:
            return swiglu_op(self.gate_up, self.down, x)[0]
        return self.down(F.swiglu(self.gate_up(x)))   # silu(gate) * up of the [gate | up] halves, one op

    def one_op_with(self, norm: RMSNorm) -> bool:
        """Whether `norm` then this MLP can run as one CPU op (`after_norm`)."""
        return self.in_one_op and norm.weight.dtype == paddle.float32

    def after_norm(self, norm: RMSNorm, x: paddle.Tensor, residual: paddle.Tensor) -> tuple[paddle.Tensor, ...]:
        """(self(norm(x + residual)), x + residual), float32 [M, H], in one op (where `one_op_with(norm)`)."""
        return swiglu_op(self.gate_up, self.down, x, norm, residual)


class DecoderBlock(nn.Layer):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(.)). Its KV lives in cache layer `layer_index`."""

    def __init__(self, layer_index: int, hidden_size: int, num_heads: int, intermediate_size: int, eps: float):
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.attn_norm = RMSNorm(hidden_size, eps)
        self.qkv = Linear(hidden_size, 3 * hidden_size)
        self.out = Linear(hidden_size, hidden_size)
        self.mlp_norm = RMSNorm(hidden_size, eps)
        self.mlp = SwiGLU(hidden_size, intermediate_size)

    def forward(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor, attend: AttendFn) -> paddle.Tensor:
        m = x.shape[0]
        qkv = self.qkv(self.attn_norm(x)).reshape([m, 3, self.num_heads, self.head_dim])
        # q and k share the angles: one rotation for both, on a contiguous copy (halves of a strided view cost
        # several times as much to rotate)
        qk = apply_rope(qkv[:, :2].contiguous(), cos, sin)
        attn = attend(self.layer_index, qk[:, 0], qk[:, 1], qkv[:, 2])
        x = x + self.out(attn.reshape([m, self.num_heads * self.head_dim]))
        return x + self.mlp(self.mlp_norm(x))


class DenseCausalAttention:
    """An `attend` callable for B full sequences of T tokens flattened to M = B * T rows (training, no cache)."""

    def __init__(self, batch_size: int, seq_len: int):
        self.shape = (batch_size, seq_len)
        self.bias = mask_bias(np.tril(np.ones((1, batch_size, seq_len, seq_len), bool)), "float32")

    def __call__(self, layer: int, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
        b, t = self.shape
        nh, hd = q.shape[1], q.shape[2]
        q, k, v = (heads_first(x.reshape([b, t, nh, hd])) for x in (q, k, v))
        bias = paddle.expand(self.bias.astype(q.dtype), [nh, b, t, t])
        return heads_last(attention_core(q, k.contiguous(), v.contiguous(), bias))
