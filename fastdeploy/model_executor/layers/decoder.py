"""The pre-norm decoder layer of the checkpoint families (ERNIE-4.5, Qwen3, ...): GQA attention with rotary
embedding and optional per-head q/k RMSNorm, then an MLP the model chooses (SwiGLU, or layers/moe.py's MoE), each
behind an RMSNorm with the checkpoint's eps and a residual.

Parameter layout is the kernels' (docs/design.md §3): every projection is `[in, out]` and contiguous, q/k/v fused
as [q heads | k heads | v heads] along the output axis, gate/up fused as [gate | up] (layers/transformer.SwiGLU).
The weight maps in models/ bring both checkpoint layouts to it at load.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import paddle
from paddle import nn

from fastdeploy.model_executor.layers.quantization.base import CpuOperands
from fastdeploy.model_executor.layers.rotary import RotaryEmbedding
from fastdeploy.model_executor.layers.transformer import AttendFn, Linear, RMSNorm, SwiGLU, products_in_one_op


@dataclass(frozen=True, slots=True)
class AttentionShape:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    qk_norm: bool        # Qwen3: RMSNorm over head_dim of each q and k head, before the rotation
    rms_eps: float
    qkv_bias: bool = False   # Qwen2: a bias on the q, k and v projections (none on the output projection)

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"AttentionShape: num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads})")

    @property
    def kv_tail(self) -> tuple[int, int, int]:
        """The cache layer tail (K and V of every KV head)."""
        return (2, self.num_kv_heads, self.head_dim)


class GQAAttention(nn.Layer):
    """Grouped-query attention: query head h reads KV head h // (num_heads / num_kv_heads), as HF `repeat_kv`
    does; the grouping itself happens in the `attend` callable (layers/paged_attention.py)."""

    def __init__(self, layer_index: int, shape: AttentionShape):
        super().__init__()
        self.layer_index = layer_index
        self.shape = shape
        s = shape
        self.q_size, self.kv_size = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        self.qkv = Linear(s.hidden_size, self.q_size + 2 * self.kv_size)
        self.out = Linear(self.q_size, s.hidden_size)
        if s.qkv_bias:
            self.qkv_bias = self.create_parameter([self.q_size + 2 * self.kv_size], is_bias=True)
        if s.qk_norm:
            self.q_norm = RMSNorm(s.head_dim, s.rms_eps)
            self.k_norm = RMSNorm(s.head_dim, s.rms_eps)

    def one_op_with(self, norm: RMSNorm) -> bool:
        """Whether `norm` then this attention can run as one CPU op over decode rows (`after_norm`): both
        products are fd_cpu_linear, the norm's weight float32, and no bias or q/k norm sits between them."""
        return (not self.shape.qkv_bias and not self.shape.qk_norm and products_in_one_op(self.qkv, self.out)
                and norm.weight.dtype == paddle.float32)

    def after_norm(self, norm: RMSNorm, x: paddle.Tensor, residual: paddle.Tensor | None, rope: RotaryEmbedding,
                   cos: paddle.Tensor, sin: paddle.Tensor, attend: AttendFn) -> tuple[paddle.Tensor, paddle.Tensor]:
        """(self(norm(x + residual)), x + residual) in one op, where `one_op_with(norm)` and the pass's attention
        `runs_blocks` (layers/paged_attention.py); residual None: the first layer's (self(norm(x)), x)."""
        return attend.attention_block(self.layer_index, x, residual, norm.weight, norm.eps,
                                      self.qkv.method.cpu_operands(self.qkv), self.out.method.cpu_operands(self.out),
                                      cos, sin, rope.style == "interleaved")

    def forward(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor, rope: RotaryEmbedding,
                attend: AttendFn) -> paddle.Tensor:
        m, s = x.shape[0], self.shape
        qkv = self.qkv(x)
        if s.qkv_bias:
            qkv = qkv + self.qkv_bias
        if not s.qk_norm and getattr(attend, "fuses_rope", False):   # decode rows on the CPU: one op, same bits
            out = attend.attend_qkv(self.layer_index, qkv, cos, sin, rope.style == "interleaved")
            return self.out(out.reshape([m, self.q_size]))
        v = qkv[:, self.q_size + self.kv_size:].reshape([m, s.num_kv_heads, s.head_dim])
        if s.qk_norm:
            q = self.q_norm(qkv[:, :self.q_size].reshape([m, s.num_heads, s.head_dim]))
            k = self.k_norm(qkv[:, self.q_size:self.q_size + self.kv_size].reshape([m, s.num_kv_heads, s.head_dim]))
            q, k = rope.rotate(q, cos, sin), rope.rotate(k, cos, sin)
        else:   # the q and k heads are adjacent in qkv: one rotation for both
            qk = rope.rotate(qkv[:, :self.q_size + self.kv_size].reshape([m, s.num_heads + s.num_kv_heads,
                                                                          s.head_dim]), cos, sin)
            q, k = qk[:, :s.num_heads], qk[:, s.num_heads:]
        out = attend(self.layer_index, q, k, v)
        return self.out(out.reshape([m, self.q_size]))


class DecoderLayer(nn.Layer):
    """x + attn(norm(x)), then + mlp(norm(.)). `mlp` is any [M, H] -> [M, H] layer (SwiGLU, MoE).

    The residual stream is carried across layers unsummed: a layer takes (x, residual) and returns
    (mlp output, residual) whose sum is its output, so each residual add is one op with the norm after it
    (RMSNorm's `residual`); the first layer takes residual None, and the caller adds the last pair."""

    def __init__(self, layer_index: int, shape: AttentionShape, mlp: nn.Layer):
        super().__init__()
        self.layer_index = layer_index
        self.attn_norm = RMSNorm(shape.hidden_size, shape.rms_eps)
        self.attn = GQAAttention(layer_index, shape)
        self.mlp_norm = RMSNorm(shape.hidden_size, shape.rms_eps)
        self.mlp = mlp
        # the norm, gate|up, SwiGLU and down as one op where all of them run on the CPU ops (the same kernels, no
        # host code between them: docs/benchmarks.md "One op for a layer's MLP")
        self.mlp_in_one_op = isinstance(mlp, SwiGLU) and mlp.one_op_with(self.mlp_norm)
        # likewise the norm, q|k|v, rotation and cache write, attention and output product over decode rows
        self.attn_in_one_op = self.attn.one_op_with(self.attn_norm)

    def forward(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor, rope: RotaryEmbedding,
                attend: AttendFn, residual: paddle.Tensor | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        if self.attn_in_one_op and getattr(attend, "runs_blocks", False):
            h, residual = self.attn.after_norm(self.attn_norm, x, residual, rope, cos, sin, attend)
        else:
            h, residual = (self.attn_norm(x), x) if residual is None else self.attn_norm(x, residual)
            h = self.attn(h, cos, sin, rope, attend)
        if self.mlp_in_one_op:
            return self.mlp.after_norm(self.mlp_norm, h, residual)
        h, residual = self.mlp_norm(h, residual)
        return self.mlp(h), residual


class StackOperands(NamedTuple):
    """What fd_cpu_decoder_stack (OPS §13.4) takes of a stack of decoder layers besides the pass's tensors."""
    lists: list[list[paddle.Tensor]]   # its ten per-layer lists, in its order: attention norm, q|k|v and scales,
                                       # output product and scales, MLP norm, gate|up and scales, down and scales
    eps: float
    hidden: int
    intermediate: int
    interleaved: bool
    kinds: tuple[int, ...]             # kind and kernel of the q|k|v, output, gate|up and down products


def stack_operands(layers: list[DecoderLayer], rope: RotaryEmbedding) -> StackOperands | None:
    """The stack's operands where every layer runs both halves as one op (`attn_in_one_op`, `mlp_in_one_op`) and
    the layers agree on eps and on each product's kind and kernel (one op takes one of each); else None. Taken after
    the weights are loaded (a method packs them at load)."""
    if not layers or not all(layer.attn_in_one_op and layer.mlp_in_one_op for layer in layers):
        return None
    products = [[lin.method.cpu_operands(lin) for lin in (layer.attn.qkv, layer.attn.out, layer.mlp.gate_up,
                                                          layer.mlp.down)] for layer in layers]
    kinds = {tuple(v for o in ops for v in (o.kind, o.kernel)) for ops in products}
    eps = {n.eps for layer in layers for n in (layer.attn_norm, layer.mlp_norm)}
    if len(kinds) != 1 or len(eps) != 1:
        return None
    def packed_and_scales(j: int) -> list[list[paddle.Tensor]]:
        return [[ops[j].packed for ops in products], [ops[j].scales for ops in products]]

    lists = [[layer.attn_norm.weight for layer in layers], *packed_and_scales(0), *packed_and_scales(1),
             [layer.mlp_norm.weight for layer in layers], *packed_and_scales(2), *packed_and_scales(3)]
    return StackOperands(lists, eps.pop(), products[0][0].k, products[0][3].k, rope.style == "interleaved",
                         kinds.pop())
