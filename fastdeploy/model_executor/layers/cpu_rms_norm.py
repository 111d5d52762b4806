"""RMSNorm of float32 activations on the CPU through the project's op (OPS §12: `fd_cpu_rms_norm`), bit for bit
Paddle's `fused_rms_norm`, without the Intel OpenMP parallel region Paddle's kernel opens for every call: in a
two-thread decode step that region waits for a core the project's own ops (GNU OpenMP) still hold, tens to hundreds
of us a norm instead of 4 (docs/benchmarks.md "One OpenMP runtime in a decode step"). Used where the attention ops
are (layers/fused_attention.py: the CPU runs the project's AVX-512 kernels)."""
from __future__ import annotations

import paddle

from fastdeploy.model_executor.layers.fused_attention import AVAILABLE
from fastdeploy.model_executor.layers.quantization.base import empty_float32
from fastdeploy.model_executor.ops import _loader

__all__ = ["AVAILABLE", "rms_norm"]


def rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float,
             residual: paddle.Tensor | None = None) -> tuple[paddle.Tensor, paddle.Tensor | None]:
    """x [..., H], weight [H], float32 -> (the norm of x (+ residual) over the last axis, x + residual or None)."""
    if residual is None:
        return _loader.cpu_ops().fd_cpu_rms_norm(x, weight, empty_float32(), eps)[0], None
    out, summed = _loader.cpu_ops().fd_cpu_rms_norm(x, weight, residual, eps)
    return out, summed
