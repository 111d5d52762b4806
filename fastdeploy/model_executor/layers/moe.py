"""ERNIE-4.5's mixture-of-experts MLP (docs/models.md "ERNIE-4.5 MoE and MTP"): a float32 softmax router whose
top-k is chosen with a correction bias, SwiGLU experts computed only for the tokens routed to them, and shared
experts added unweighted.

Routing, per token x [H] (transformers' `Ernie4_5_MoeTopKRouter`, FastDeploy's `ernie4_5_moe.py`):
    p = softmax(x_f32 @ gate^T)                 gate [E, H] float32 whatever the model's dtype
    chosen = top-k of (p + e_score_correction_bias)     the bias only decides which experts, never how much
    w = p[chosen] / max(sum(p[chosen]), moe_norm_min)
    out = sum_j w_j * expert_{chosen_j}(x) + shared(x)

The experts run grouped: the (token, choice) pairs of a pass are sorted by expert, the tokens gathered once,
each expert that received any runs one matmul pair over its contiguous run, and one scatter-add puts the weighted
rows back. A decode step at batch 1 so touches k experts, not E, and no pass computes an all-experts product.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from fastdeploy.model_executor.layers.transformer import Linear, SwiGLU


@dataclass(frozen=True, slots=True)
class MoEConfig:
    hidden_size: int
    moe_intermediate_size: int     # width of each routed expert
    num_experts: int               # moe_num_experts
    top_k: int                     # moe_k
    num_shared_experts: int = 0    # moe_num_shared_experts: one SwiGLU of width moe_intermediate_size x this
    norm_min: float = 1e-12        # moe_norm_min

    def __post_init__(self):
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"MoEConfig: field 'moe_k' ({self.top_k}) must be in 1 .. moe_num_experts "
                             f"({self.num_experts})")
        if self.num_shared_experts < 0:
            raise ValueError(f"MoEConfig: field 'moe_num_shared_experts' must be >= 0, got {self.num_shared_experts}")


class ErnieMoE(nn.Layer):
    """The MoE MLP of one ERNIE-4.5 layer: [M, H] -> [M, H].

    Parameters (weights in the project's [in, out] orientation):
      gate_weight              [E, H]      float32 always (the checkpoint's `mlp.gate.weight`, as stored)
      e_score_correction_bias  [E]         float32 (`mlp.moe_statics.e_score_correction_bias`, stored [1, E])
      experts_up_gate          E Linear(H, 2I) of kind "moe": gate then up (`mlp.experts.{j}.{gate,up}_proj`)
      experts_down             E Linear(I, H) of kind "moe" (`mlp.experts.{j}.down_proj`)
      shared                   SwiGLU(H, I x S) of kind "dense" (`mlp.shared_experts.*`), absent when S = 0
    The experts' storage is the precision's method for "moe" (layers/quantization/: ERNIE's wint4 stores them in
    int4 while the dense layers take int8).
    """

    def __init__(self, cfg: MoEConfig, dtype: str = "float32"):
        super().__init__()
        self.cfg = cfg
        h, i, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
        normal = nn.initializer.Normal(std=0.02)
        self.gate_weight = self.create_parameter([e, h], dtype="float32", default_initializer=normal)
        self.e_score_correction_bias = self.create_parameter([e], dtype="float32",
                                                             default_initializer=nn.initializer.Constant(0.0))
        self.experts_up_gate = nn.LayerList([Linear(h, 2 * i, kind="moe") for _ in range(e)])
        self.experts_down = nn.LayerList([Linear(i, h, kind="moe") for _ in range(e)])
        self.shared = SwiGLU(h, i * cfg.num_shared_experts) if cfg.num_shared_experts else None
        if dtype != "float32":   # the float64 exactness tests: everything but the router
            for part in (self.experts_up_gate, self.experts_down, self.shared):
                if part is not None:
                    part.to(dtype=dtype)

    def route(self, x: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """x [M, H] -> (chosen experts [M, k] int64, their weights [M, k] float32)."""
        gate, bias = self.gate_weight, self.e_score_correction_bias
        if gate.dtype != paddle.float32:      # a whole-model Layer.to(dtype) cast them: route in float32 regardless
            gate, bias = gate.astype("float32"), bias.astype("float32")
        probs = F.softmax(paddle.matmul(x.astype("float32"), gate, transpose_y=True), axis=-1)
        _, chosen = paddle.topk(probs + bias, self.cfg.top_k, axis=-1)
        weights = paddle.take_along_axis(probs, chosen, axis=-1)
        return chosen, weights / paddle.clip(weights.sum(axis=-1, keepdim=True), min=self.cfg.norm_min)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:  # [M, H] -> [M, H]
        if x.shape[0] == 0:
            return x
        chosen, weights = self.route(x)
        out = self._experts(x, chosen.numpy(), weights.astype(x.dtype))
        return out if self.shared is None else out + self.shared(x)

    def _experts(self, x: paddle.Tensor, chosen: np.ndarray, weights: paddle.Tensor) -> paddle.Tensor:
        """sum_j w_j * expert_{chosen_j}(x), grouped by expert: chosen [M, k] (host), weights [M, k]."""
        k = chosen.shape[1]
        flat = chosen.reshape(-1)
        order = np.argsort(flat, kind="stable")          # (token, choice) pairs, expert by expert
        bounds = np.searchsorted(flat[order], np.arange(self.cfg.num_experts + 1))
        tokens = paddle.to_tensor(order // k)
        rows = paddle.gather(x, tokens)                  # [M * k, H], the tokens in expert order
        outs = []
        for e in np.flatnonzero(np.diff(bounds)):
            run = rows[int(bounds[e]):int(bounds[e + 1])]
            outs.append(self.experts_down[int(e)](F.swiglu(self.experts_up_gate[int(e)](run))))
        scaled = paddle.concat(outs) * paddle.gather(weights.reshape([-1, 1]), paddle.to_tensor(order))
        return paddle.index_add(paddle.zeros_like(x), tokens, 0, scaled)
