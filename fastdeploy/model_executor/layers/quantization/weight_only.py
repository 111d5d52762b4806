"""Weight-only quantization, WINT8 and WINT4 (FastDeploy's `weight_only`, Paddle's `weight_quantize` with
group_size -1; OPS §10.2 is the normative text):

    scale[n] = round_to_dtype(max_k |W[k, n]| / qmax)        qmax = 127 (int8) or 7 (int4); 1 for an all-zero column
    Q[k, n]  = clip(round_half_away_from_zero(W[k, n] / scale[n]), -qmax, qmax)
    y        = x @ (Q * scale)                                 the dequantized product

round_to_dtype rounds the scale to the model's dtype (bfloat16 / float16: Paddle keeps the scale in the
activations' dtype), so the device and the CPU dequantize to the same weights. On the CPU the product is the
project's fd_cpu_linear (x rounded to bf16, OPS §10.3); on Kunlun / GPU Paddle's weight_only_linear (not run here).
"""
from __future__ import annotations

import numpy as np
import paddle

from fastdeploy.model_executor.layers.quantization.base import (CPU_KERNEL, KIND_INT4, KIND_INT8, ON_CPU,
                                                                CpuOperands, LinearMethod, check_weight, cpu_apply,
                                                                cpu_pack)

QMAX = {8: 127, 4: 7}


def round_to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), returned as float32."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def round_to_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return round_to_bf16(a)
    if dtype == "float16":
        return a.astype(np.float16).astype(np.float32)
    return a.astype(np.float32)


def quantize(weight: np.ndarray, bits: int, dtype: str = "bfloat16") -> tuple[np.ndarray, np.ndarray]:
    """The reference quantizer: weight [K, N] -> (Q int8 [K, N] in [-qmax, qmax], scale float32 [N])."""
    qmax = QMAX[bits]
    w = np.asarray(weight, np.float32)
    absmax = np.abs(w).max(axis=0) if w.shape[0] else np.zeros(w.shape[1], np.float32)
    scale = round_to_dtype(np.where(absmax > 0, absmax / np.float32(qmax), np.float32(1.0)), dtype)
    ratio = w / scale
    q = np.clip(np.trunc(ratio + np.copysign(np.float32(0.5), ratio)), -qmax, qmax)
    return q.astype(np.int8), scale.astype(np.float32)


def dequantize(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Q * scale, float32 [K, N]: the weights the quantized layer multiplies by."""
    return q.astype(np.float32) * scale[None, :]


class WeightOnly(LinearMethod):
    def __init__(self, bits: int, dtype: str):
        if bits not in QMAX:
            raise ValueError(f"WeightOnly: argument 'bits' must be 8 or 4, got {bits!r}")
        self.bits, self.dtype = bits, dtype

    def create(self, layer) -> None:
        layer.packed, layer.scales = None, None

    def load(self, layer, weight: np.ndarray) -> None:
        check_weight(layer, weight)
        q, scale = quantize(weight, self.bits, self.dtype)
        if not ON_CPU:   # Paddle's own kernels on Kunlun / GPU (not run here: no device)
            algo = f"weight_only_int{self.bits}"
            w = paddle.to_tensor(dequantize(q, scale)).astype(self.dtype)
            layer.packed, layer.scales = paddle.nn.quant.weight_quantize(w, algo=algo)
            return
        layer.packed = cpu_pack(q, KIND_INT8 if self.bits == 8 else KIND_INT4)
        layer.scales = paddle.to_tensor(scale)

    def apply(self, layer, x: paddle.Tensor) -> paddle.Tensor:
        if ON_CPU:
            return cpu_apply(x, self.cpu_operands(layer))
        out = paddle.nn.quant.weight_only_linear(x.astype(self.dtype), layer.packed, weight_scale=layer.scales,
                                                 weight_dtype=f"int{self.bits}")
        return out.astype(x.dtype)

    def cpu_operands(self, layer) -> CpuOperands | None:
        if not ON_CPU:
            return None
        return CpuOperands(layer.packed, layer.scales, layer.in_features, layer.out_features,
                           KIND_INT8 if self.bits == 8 else KIND_INT4, CPU_KERNEL)

    def stored_bytes(self, layer) -> int:
        return sum(int(t.numel()) * t.element_size() for t in (layer.packed, layer.scales))
