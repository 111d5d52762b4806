"""The interface of a linear layer's storage and product (layers/quantization/__init__.py)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import paddle

from fastdeploy.model_executor.ops import _loader

# Paddle's CPU wheel has no bf16 matmul and no weight_only_linear kernel: on the CPU the reduced-precision
# products are the project's ops (custom_ops/cpu_ops/cpu_linear.cc, OPS §10).
ON_CPU = not (paddle.is_compiled_with_xpu() or paddle.is_compiled_with_cuda())
KIND_BF16, KIND_INT8, KIND_INT4, KIND_F32 = 0, 1, 2, 3
KERNEL_ONEDNN, KERNEL_DPBF16 = 0, 1
_EMPTY = None


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


# The project's own AVX512_BF16 kernel where the CPU has it (oneDNN stays above the weights' read time at the
# batch sizes of decoding: OPS §10.5, benchmarks/cpu_linear.py), else oneDNN. Chosen once per process, so every
# layer's packed weights and products agree.
CPU_KERNEL = (KERNEL_DPBF16 if {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512vbmi"} <= _cpu_flags()
              else KERNEL_ONEDNN)


class CpuOperands(NamedTuple):
    """fd_cpu_linear's arguments after x: the packed weights, their scales ([0] for bf16 and float32), K, N, the
    weights' kind and the kernel that packed them."""
    packed: paddle.Tensor
    scales: paddle.Tensor
    k: int
    n: int
    kind: int
    kernel: int


class LinearMethod:
    """Creates, loads and applies the weights of one Linear layer (y = x @ W, W [in, out])."""

    gives_columns = False   # whether `columns` reads W's columns back exactly

    def create(self, layer) -> None:
        raise NotImplementedError

    def load(self, layer, weight: np.ndarray) -> None:
        """weight: [in, out] float32 (or float64), the checkpoint's values."""
        raise NotImplementedError

    def apply(self, layer, x: paddle.Tensor) -> paddle.Tensor:
        raise NotImplementedError

    def stored_bytes(self, layer) -> int:
        """Bytes the layer's weights (and scales) occupy."""
        raise NotImplementedError

    def columns(self, layer, ids: paddle.Tensor) -> paddle.Tensor:
        """Columns `ids` [L] of W as rows [L, in] in the activations' dtype, exactly as stored, where
        `gives_columns`: a tied LM head read as the embedding table."""
        raise NotImplementedError

    def cpu_operands(self, layer) -> CpuOperands | None:
        """Where this method's product is fd_cpu_linear, that op's arguments after x (so an op that runs several
        products, fd_cpu_swiglu_mlp, can run it); None where it is not (Paddle's matmul, a device's kernels)."""
        return None


def check_weight(layer, weight: np.ndarray) -> None:
    if weight.shape != (layer.in_features, layer.out_features):   # a model-side bug: the loader checked shapes
        raise RuntimeError(f"linear [{layer.in_features}, {layer.out_features}] given a weight of shape "
                           f"{list(weight.shape)}")


def cpu_pack(weight: np.ndarray, kind: int, kernel: int = CPU_KERNEL) -> paddle.Tensor:
    """fd_cpu_pack_weight: weight [K, N] float32 (kind bf16) or int8 (kinds int8, int4) -> packed uint8."""
    return _loader.cpu_ops().fd_cpu_pack_weight(paddle.to_tensor(weight), kind, kernel)[0]


def empty_float32() -> paddle.Tensor:
    """The [0] float32 tensor the CPU ops take for an absent argument (no scales, no residual, no norm), made
    once."""
    global _EMPTY
    if _EMPTY is None:
        _EMPTY = paddle.zeros([0], "float32")
    return _EMPTY


def cpu_linear(x: paddle.Tensor, packed: paddle.Tensor, scales: paddle.Tensor | None, k: int, n: int,
               kind: int, kernel: int = CPU_KERNEL) -> paddle.Tensor:
    """fd_cpu_linear: x [M, K] float32 -> [M, N] float32 (scales [N] for the integer kinds)."""
    return _loader.cpu_ops().fd_cpu_linear(x, packed, empty_float32() if scales is None else scales, k, n, kind,
                                           kernel)[0]


def cpu_apply(x: paddle.Tensor, operands: CpuOperands) -> paddle.Tensor:
    """fd_cpu_linear of x [M, K] float32 with a method's operands -> [M, N] float32."""
    return _loader.cpu_ops().fd_cpu_linear(x, *operands)[0]


def cpu_columns(packed: paddle.Tensor, ids: paddle.Tensor, k: int, n: int, kind: int) -> paddle.Tensor:
    """fd_cpu_packed_columns: columns ids [L] of a kernel-1 bf16 / float32 pack of W [K, N] -> [L, K] float32."""
    return _loader.cpu_ops().fd_cpu_packed_columns(packed, ids, k, n, kind, KERNEL_DPBF16)[0]
