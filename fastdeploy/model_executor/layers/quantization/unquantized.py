"""Weights stored unquantized: `Plain` (a float32 parameter, cast with the model to float64 for the exactness
tests; Paddle's matmul), `PackedFloat32` (float32 for the CPU's own kernel) and `HalfPrecision` (bfloat16 /
float16 storage)."""
from __future__ import annotations

import numpy as np
import paddle

from fastdeploy.model_executor.layers.quantization.base import (CPU_KERNEL, KERNEL_DPBF16, KIND_BF16, KIND_F32,
                                                                ON_CPU, CpuOperands, LinearMethod, check_weight,
                                                                cpu_apply, cpu_columns, cpu_pack, empty_float32)


class Plain(LinearMethod):
    """A trainable [in, out] parameter, created as nn.Linear creates its weight (same initialiser); one matmul."""

    def create(self, layer) -> None:
        layer.weight = layer.create_parameter([layer.in_features, layer.out_features])

    def load(self, layer, weight: np.ndarray) -> None:
        check_weight(layer, weight)
        layer.weight.set_value(weight.astype(np.float64 if layer.weight.dtype == paddle.float64 else np.float32,
                                             copy=False))

    def apply(self, layer, x: paddle.Tensor) -> paddle.Tensor:
        return paddle.matmul(x, layer.weight)

    def stored_bytes(self, layer) -> int:
        return int(layer.weight.numel()) * layer.weight.element_size()

    gives_columns = True

    def columns(self, layer, ids: paddle.Tensor) -> paddle.Tensor:
        return paddle.index_select(layer.weight, ids, axis=1).transpose([1, 0])


class PackedFloat32(LinearMethod):
    """float32 weights in the layout of the CPU's own kernel (OPS §10.5, a CPU with AVX512_BF16): one FMA chain per
    output element whatever the row count (a verify's rows are each a decode's, bit for bit, which MKL's GEMM does
    not promise), and near the weights' read time at decode's row counts, where MKL is not
    (benchmarks/cpu_linear.py). Inference only: no gradient (the embedded models, which train, stay `Plain`)."""

    def create(self, layer) -> None:
        layer.packed = None

    def load(self, layer, weight: np.ndarray) -> None:
        check_weight(layer, weight)
        layer.packed = cpu_pack(np.ascontiguousarray(weight, np.float32), KIND_F32, KERNEL_DPBF16)

    def apply(self, layer, x: paddle.Tensor) -> paddle.Tensor:
        return cpu_apply(x, self.cpu_operands(layer))

    def cpu_operands(self, layer) -> CpuOperands:
        return CpuOperands(layer.packed, empty_float32(), layer.in_features, layer.out_features, KIND_F32,
                           KERNEL_DPBF16)

    def stored_bytes(self, layer) -> int:
        return int(layer.packed.numel())

    gives_columns = True

    def columns(self, layer, ids: paddle.Tensor) -> paddle.Tensor:
        return cpu_columns(layer.packed, ids, layer.in_features, layer.out_features, KIND_F32)


class HalfPrecision(LinearMethod):
    """16-bit weights. On the CPU bfloat16 through fd_cpu_linear (x rounded to bf16, float32 accumulation and output);
    float16 has no fast kernel on a CPU without AVX512-FP16 and is refused there. On Kunlun / GPU a parameter
    of that dtype and Paddle's own matmul (not run here: no device)."""

    def __init__(self, dtype: str):
        if ON_CPU and dtype != "bfloat16":
            raise ValueError(f"dtype {dtype!r} has no CPU kernel here (oneDNN's float16 matmul needs AVX512-FP16 or "
                             f"AMX); use bfloat16")
        self.dtype = dtype

    def create(self, layer) -> None:
        layer.packed = None
        if not ON_CPU:
            layer.weight = layer.create_parameter([layer.in_features, layer.out_features], dtype=self.dtype)

    def load(self, layer, weight: np.ndarray) -> None:
        check_weight(layer, weight)
        if ON_CPU:
            layer.packed = cpu_pack(np.ascontiguousarray(weight, np.float32), KIND_BF16)
        else:
            layer.weight.set_value(paddle.to_tensor(weight.astype(np.float32)).astype(self.dtype))

    def apply(self, layer, x: paddle.Tensor) -> paddle.Tensor:
        if ON_CPU:
            return cpu_apply(x, self.cpu_operands(layer))
        return paddle.matmul(x.astype(self.dtype), layer.weight).astype(x.dtype)

    def cpu_operands(self, layer) -> CpuOperands | None:
        if not ON_CPU:
            return None
        return CpuOperands(layer.packed, empty_float32(), layer.in_features, layer.out_features, KIND_BF16, CPU_KERNEL)

    def stored_bytes(self, layer) -> int:
        stored = layer.packed if ON_CPU else layer.weight   # the CPU's blocked layout may pad
        return int(stored.numel()) * stored.element_size()

    # kernel 1's layout gives columns back; oneDNN's blocked layout is its own, and the device's is Paddle's
    gives_columns = ON_CPU and CPU_KERNEL == KERNEL_DPBF16

    def columns(self, layer, ids: paddle.Tensor) -> paddle.Tensor:
        return cpu_columns(layer.packed, ids, layer.in_features, layer.out_features, KIND_BF16)
