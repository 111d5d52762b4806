"""Rotary position embedding in the two variants the checkpoints use (docs/models.md "Architectures").

Both rotate pairs of entries of each head by the angle position * base^(-2i / head_dim), i = 0 .. head_dim/2 - 1;
they differ in which entries form pair i:
- "neox" (halves): entries i and i + head_dim/2 (Llama, Qwen2/3, fd-tiny; HF `rotate_half` by halves);
- "interleaved" (GPT-J style): entries 2i and 2i + 1 (ERNIE-4.5: HF `modeling_ernie4_5.py` "glm rope style",
  FastDeploy `use_neox_rotary_style=False`).
The angle table is layers/transformer.py's RopeTable (computed in float64, cast to the model dtype).
"""
from __future__ import annotations

import paddle

from fastdeploy.model_executor.layers.transformer import RopeTable, apply_rope

ROPE_STYLES = ("neox", "interleaved")


def apply_rope_interleaved(x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
    """Rotate the pairs (2i, 2i + 1) of the last axis of x [..., hd] by cos/sin [..., hd / 2] (broadcast)."""
    pairs = x.reshape([*x.shape[:-1], x.shape[-1] // 2, 2])
    even, odd = pairs[..., 0], pairs[..., 1]
    return paddle.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1).reshape(x.shape)


class RotaryEmbedding:
    """The rotation of one model: `angles(positions, dtype)` once per pass, then `rotate(x, cos, sin)` of each
    [M, heads, head_dim] tensor (q and k may have different head counts under GQA)."""

    def __init__(self, head_dim: int, base: float, style: str):
        if style not in ROPE_STYLES:
            raise ValueError(f"RotaryEmbedding: argument 'style' must be one of {ROPE_STYLES}, got {style!r}")
        if head_dim % 2:
            raise ValueError(f"RotaryEmbedding: argument 'head_dim' must be even, got {head_dim}")
        self.style = style
        self.table = RopeTable(head_dim, base)

    def angles(self, positions: paddle.Tensor, dtype) -> tuple[paddle.Tensor, paddle.Tensor]:
        """cos, sin [M, 1, head_dim / 2] of int64 positions [M]: broadcast over the heads."""
        cos, sin = self.table(positions, dtype)
        return cos.reshape([cos.shape[0], 1, -1]), sin.reshape([sin.shape[0], 1, -1])

    def rotate(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
        if self.style == "neox":
            return apply_rope(x, cos, sin)
        return apply_rope_interleaved(x, cos, sin)
