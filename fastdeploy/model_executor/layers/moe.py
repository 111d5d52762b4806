"""ERNIE-4.5's mixture-of-experts MLP (docs/models.md "ERNIE-4.5 MoE and MTP"): a float32 softmax router whose
top-k is chosen with a correction bias, SwiGLU experts computed only for the tokens routed to them, and shared
experts added unweighted.

Routing, per token x [H] (transformers' `Ernie4_5_MoeTopKRouter`, FastDeploy's `ernie4_5_moe.py`):
    p = softmax(x_f32 @ gate^T)                 gate [E, H] float32 whatever the model's dtype
    chosen = top-k of (p + e_score_correction_bias)     the bias only decides which experts, never how much
    w = p[chosen] / max(sum(p[chosen]), moe_norm_min)
    out = sum_j w_j * expert_{chosen_j}(x) + shared(x)

The experts run grouped: the (token, choice) pairs of a pass are sorted by expert, each expert that received any
runs its MLP over its contiguous run, and its weighted rows are added to their tokens' sums. A decode step at
batch 1 so touches k experts, not E, and no pass computes an all-experts product. Where the experts' products are
the CPU ops, the router with the grouping is one op (fd_cpu_moe_route, OPS §13.5) and the routed experts with the
shared ones another (fd_cpu_moe_experts, OPS §13.2); elsewhere the router runs on the host in NumPy (`route`)
and each expert's MLP is its own layer call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from fastdeploy.model_executor.layers.quantization.base import empty_float32
from fastdeploy.model_executor.layers.transformer import Linear, SwiGLU, products_in_one_op
from fastdeploy.model_executor.ops import _loader

_NP_DTYPE = {paddle.float32: np.float32, paddle.float64: np.float64}


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


class ExpertOperands(NamedTuple):
    """fd_cpu_moe_experts' operands (OPS §13.2): the routed experts' packed gate|up and down weights with their
    scales, indexed by expert; the shared experts' four tensors ([0] each where the op does not run them); the op's
    attributes (each product's K, kind and kernel; the shared experts' width, 0 for none, and kinds)."""
    up_gate: list[paddle.Tensor]
    up_gate_scales: list[paddle.Tensor]
    down: list[paddle.Tensor]
    down_scales: list[paddle.Tensor]
    shared: tuple[paddle.Tensor, ...]
    attrs: tuple[int, ...]
    shared_in_op: bool


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
        # each expert's gate|up, SwiGLU and down as one op where its products are CPU ops (as SwiGLU's own)
        self.experts_in_one_op = products_in_one_op(self.experts_up_gate[0], self.experts_down[0])
        self._expert_operands: ExpertOperands | None = None

    def route(self, x: paddle.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """x [M, H] -> (chosen experts [M, k] int64, their weights [M, k] float32), on the host.

        In NumPy: a decode step's router is [1, H] x [H, E], where a dozen Paddle ops cost their dispatch, not their
        arithmetic (~0.5 ms a layer), and the host needs the choice anyway to group the experts. Each row's logits
        are their own product (a row times the gate), so a token routes the same alone and in any batch."""
        # the parameters' own memory (no copy; float32 even after a whole-model cast to float64)
        gate, bias = (np.from_dlpack(p.detach()).astype(np.float32, copy=False)
                      for p in (self.gate_weight, self.e_score_correction_bias))
        xs = x.numpy().astype(np.float32, copy=False)
        logits = np.stack([gate @ row for row in xs])                           # [M, E], one product a row
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        chosen = np.argsort(-(probs + bias), axis=-1, kind="stable")[:, :self.cfg.top_k]
        weights = np.take_along_axis(probs, chosen, axis=-1)
        return chosen, weights / np.maximum(weights.sum(axis=-1, keepdims=True), np.float32(self.cfg.norm_min))

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:  # [M, H] -> [M, H]
        if x.shape[0] == 0:
            return x
        if self.experts_in_one_op:
            ops = self._expert_operands or self._gather_expert_operands()
            out = self._experts_in_ops(x, ops)
            if ops.shared_in_op:
                return out
        else:
            out = self._experts(x, *self.route(x))
        return out if self.shared is None else out + self.shared(x)

    def _experts_in_ops(self, x: paddle.Tensor, ops: ExpertOperands) -> paddle.Tensor:
        """The router and grouping (fd_cpu_moe_route), then every run of routed experts and the shared experts
        (fd_cpu_moe_experts): two ops, the host only picking the runs' experts' operands."""
        tokens, weights, run_ends, experts = _loader.cpu_ops().fd_cpu_moe_route(
            x, self.gate_weight, self.e_score_correction_bias, self.cfg.top_k, self.cfg.norm_min)
        chosen = experts.numpy().tolist()
        return _loader.cpu_ops().fd_cpu_moe_experts(
            x, tokens, weights, run_ends, *([per_expert[e] for e in chosen] for per_expert in ops[:4]), *ops.shared,
            *ops.attrs)[0]

    def _gather_expert_operands(self) -> ExpertOperands:
        """Every expert's operands, gathered at the first pass and kept: the weights are loaded (packed) before any
        pass and never again, and gathering them a pass cost ~0.15 ms of host time a layer at batch 1. The shared
        experts go into the op where their products are CPU ops too (their output added after the routed sum, as
        `forward` adds it otherwise)."""
        up_gate = [lin.method.cpu_operands(lin) for lin in self.experts_up_gate]
        down = [lin.method.cpu_operands(lin) for lin in self.experts_down]
        g, d = up_gate[0], down[0]
        shared_in_op = self.shared is not None and self.shared.in_one_op
        if shared_in_op:
            sg, sd = (lin.method.cpu_operands(lin) for lin in (self.shared.gate_up, self.shared.down))
            shared, shared_attrs = (sg.packed, sg.scales, sd.packed, sd.scales), (sd.k, sg.kind, sg.kernel, sd.kind,
                                                                                  sd.kernel)
        else:
            shared, shared_attrs = (empty_float32(),) * 4, (0,) * 5
        self._expert_operands = ExpertOperands([o.packed for o in up_gate], [o.scales for o in up_gate],
                                               [o.packed for o in down], [o.scales for o in down], shared,
                                               (g.k, d.k, g.kind, g.kernel, d.kind, d.kernel, *shared_attrs),
                                               shared_in_op)
        return self._expert_operands

    def _experts(self, x: paddle.Tensor, chosen: np.ndarray, weights: np.ndarray) -> paddle.Tensor:
        """sum_j w_j * expert_{chosen_j}(x) on the host, grouped by expert: chosen, weights [M, k]. Each expert's
        weighted rows are added to their tokens' sums expert by expert (a token's terms in ascending expert order),
        as fd_cpu_moe_experts adds them."""
        k = chosen.shape[1]
        flat = chosen.reshape(-1)
        order = np.argsort(flat, kind="stable")          # (token, choice) pairs, expert by expert
        bounds = np.searchsorted(flat[order], np.arange(self.cfg.num_experts + 1))
        tokens = order // k
        scale = weights.reshape(-1)[order].astype(_NP_DTYPE[x.dtype])
        experts = np.flatnonzero(np.diff(bounds))
        rows = paddle.gather(x, paddle.to_tensor(tokens))   # [M * k, H], the tokens in expert order
        out = np.zeros(x.shape, _NP_DTYPE[x.dtype])
        for e in experts:
            a, b = int(bounds[e]), int(bounds[e + 1])
            up_gate, down = self.experts_up_gate[int(e)], self.experts_down[int(e)]
            out[tokens[a:b]] += scale[a:b, None] * down(F.swiglu(up_gate(rows[a:b]))).numpy()   # a token once a run
        return paddle.to_tensor(out)
