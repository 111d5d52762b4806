"""How a linear layer stores and multiplies its weights (docs/models.md "Precision"; OPS §10).

One LinearMethod per kind of storage, each in its own module: `unquantized` (float32 / float64 parameters, float32
packed for the CPU's own kernel, and 16-bit weights) and `weight_only` (WINT8 / WINT4). A model is built inside `building(precision)`; each
`layers.transformer.Linear` then asks `method_for(kind)` for its method once, at construction, where kind says
what the layer is ("dense": attention and MLP projections, "moe": routed experts, "head": the LM head, never
quantized). Model files and the runner never branch on a dtype or a method, and adding a method touches none of
them.
"""
from __future__ import annotations

import contextlib
import contextvars

from fastdeploy.precision import Precision
from fastdeploy.model_executor.layers.quantization.base import CPU_KERNEL, KERNEL_DPBF16, ON_CPU, LinearMethod
from fastdeploy.model_executor.layers.quantization.unquantized import HalfPrecision, PackedFloat32, Plain
from fastdeploy.model_executor.layers.quantization.weight_only import WeightOnly

LINEAR_KINDS = ("dense", "moe", "head")
_building: contextvars.ContextVar[Precision | None] = contextvars.ContextVar("fd_building_precision", default=None)


@contextlib.contextmanager
def building(precision: Precision):
    """Linear layers constructed inside take their method from `precision`."""
    token = _building.set(precision)
    try:
        yield
    finally:
        _building.reset(token)


def current_precision() -> Precision:
    return _building.get() or Precision()


def method_for(kind: str) -> LinearMethod:
    """The method of a linear layer of `kind` under the precision being built (float32 outside `building`)."""
    if kind not in LINEAR_KINDS:
        raise ValueError(f"method_for: argument 'kind' must be one of {LINEAR_KINDS}, got {kind!r}")
    precision = current_precision()
    weight_only = {"dense": precision.quantization.dense, "moe": precision.quantization.moe}.get(kind)
    if weight_only is not None:
        return WeightOnly(8 if weight_only == "wint8" else 4, precision.dtype)
    if precision.dtype in ("bfloat16", "float16"):
        return HalfPrecision(precision.dtype)
    if precision.dtype == "float32" and _building.get() is not None and ON_CPU and CPU_KERNEL == KERNEL_DPBF16:
        return PackedFloat32()   # a checkpoint model (built inside `building`) on a CPU with the own kernel
    return Plain()


__all__ = ["LinearMethod", "building", "current_precision", "method_for", "LINEAR_KINDS"]
