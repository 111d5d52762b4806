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

from fastdeploy.model_executor.layers.transformer import RopeTable

ROPE_STYLES = ("neox", "interleaved")


class RotaryEmbedding:
    """The rotation of one model: `angles(positions, dtype)` once per pass, then `rotate(x, cos, sin)` of each
    [M, heads, head_dim] tensor (q and k may have different head counts under GQA).

    The angles come spread over the whole head: `cos` holds each pair's cosine at both of its entries and `sin`
    its sine, negated at the pair's first entry, so a rotation is x * cos + partner(x) * sin, where partner swaps
    the entries of each pair: three or five Paddle ops where the pairwise formula takes nine or eleven. It is the
    pairwise formula bit for bit: first entry a * c + b * (-s) = a * c - b * s exactly, second b * c + a * s."""

    def __init__(self, head_dim: int, base: float, style: str):
        if style not in ROPE_STYLES:
            raise ValueError(f"RotaryEmbedding: argument 'style' must be one of {ROPE_STYLES}, got {style!r}")
        if head_dim % 2:
            raise ValueError(f"RotaryEmbedding: argument 'head_dim' must be even, got {head_dim}")
        self.style, self.head_dim = style, head_dim
        self.table = RopeTable(head_dim, base)
        self._spread: tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor] | None = None   # (source, cos, sin)

    def angles(self, positions: paddle.Tensor, dtype) -> tuple[paddle.Tensor, paddle.Tensor]:
        """cos, sin [M, 1, head_dim] of int64 positions [M], spread as the class says: broadcast over the heads."""
        cos, sin = self.table.tables(positions, dtype)
        if self._spread is None or self._spread[0] is not cos:
            n, half = cos.shape[0], self.head_dim // 2
            cos, sin = cos.reshape([n, 1, half]), sin.reshape([n, 1, half])
            if self.style == "neox":    # pair i = entries (i, i + half)
                spread = paddle.concat([cos, cos], axis=-1), paddle.concat([-sin, sin], axis=-1)
            else:                       # pair i = entries (2i, 2i + 1)
                spread = (paddle.stack([cos, cos], axis=-1).reshape([n, 1, self.head_dim]),
                          paddle.stack([-sin, sin], axis=-1).reshape([n, 1, self.head_dim]))
            self._spread = (self.table.cos, *spread)
        return paddle.gather(self._spread[1], positions), paddle.gather(self._spread[2], positions)

    def rotate(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
        if self.style == "neox":
            partner = paddle.roll(x, self.head_dim // 2, axis=-1)
        else:
            shape = x.shape
            partner = paddle.roll(x.reshape([*shape[:-1], self.head_dim // 2, 2]), 1, axis=-1).reshape(shape)
        return x * cos + partner * sin
