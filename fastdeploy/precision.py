"""The precision an instance serves its model in (docs/models.md "Precision"): `--dtype` and `--quantization`,
FastDeploy's flags with FastDeploy's meanings. No Paddle here: the config and the API server read it too.

- dtype: how the weights that are not quantized are stored (the embedding, the LM head, every linear layer without
  a weight-only method). bfloat16 and float16 store them in 16 bits; the activations between the linear layers
  stay float32 on the CPU (docs/models.md says why).
- kv_cache_dtype (vLLM's `--kv-cache-dtype`): how the KV cache is stored. `auto` is the model's dtype, as in
  FastDeploy: bfloat16 for a bfloat16 model and under weight-only quantization (whose products take bf16
  inputs), float64 for a float64 model, else float32. The attention widens what it reads to the activations'
  dtype, so a bf16 cache changes only what is stored: each K and V value rounded to bf16 (nearest even).
- quantization: weight-only, channel-wise, symmetric (FastDeploy's `weight_only.py`): "wint8" stores every linear
  layer's weights as int8, "wint4" as int4, each output channel with one scale. On a model with MoE experts
  "wint4" means FastDeploy's mix_quant: dense layers WINT8, experts WINT4. The JSON form
  `{"quantization": "mix_quant", "dense_quant_type": "wint8", "moe_quant_type": "wint4"}` names both.
  The embedding, the LM head, the norms and the MoE router are never quantized.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import orjson

DTYPES = ("float32", "float64", "bfloat16", "float16")
DTYPE_CHOICES = ("auto",) + DTYPES
WEIGHT_ONLY = ("wint8", "wint4")
KV_CACHE_DTYPES = ("float32", "float64", "bfloat16")
KV_CACHE_DTYPE_CHOICES = ("auto", "bfloat16", "float32")   # the flag's; float64 only through auto (tests)


def cpu_has_avx512_bf16() -> bool:
    """True where this CPU multiplies bf16 in hardware (oneDNN's fast bf16 kernels need it)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512_bf16" in line for line in f)
    except OSError:
        return False


def resolve_dtype(dtype: str, embedded: bool) -> str:
    """`auto`: float32 for the embedded models (their weights are float32 and their tests exact in it); for a
    checkpoint bfloat16 where the CPU has avx512_bf16, else float32."""
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"field 'dtype' must be one of {', '.join(DTYPE_CHOICES)}, got {dtype!r}")
    if dtype != "auto":
        return dtype
    return "bfloat16" if not embedded and cpu_has_avx512_bf16() else "float32"


def resolve_kv_cache_dtype(kv_cache_dtype: str, dtype: str, quantization) -> str:
    """The KV cache's storage dtype: `auto` follows the model's dtype (resolved, not "auto"), bfloat16 under a
    weight-only quantization; an explicit bfloat16 or float32 overrides it."""
    if kv_cache_dtype not in KV_CACHE_DTYPE_CHOICES:
        raise ValueError(f"field 'kv_cache_dtype' must be one of {', '.join(KV_CACHE_DTYPE_CHOICES)}, "
                         f"got {kv_cache_dtype!r}")
    if kv_cache_dtype != "auto":
        return kv_cache_dtype
    if dtype == "float64":
        return "float64"
    return "bfloat16" if dtype == "bfloat16" or parse_quantization(quantization) != NONE else "float32"


def kv_storage_dtype(kv_dtype: str) -> np.dtype:
    """The NumPy dtype that holds a KV dtype's values in host memory and on the wire. NumPy has no bfloat16, so a
    bf16 cache is held as its 16-bit patterns, uint16 ('<u2'): never float16, whose bits mean other numbers. The
    name 'bfloat16' is what identifies the KV (the PD compatibility hash, kv_identity)."""
    if kv_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"KV dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_dtype!r}")
    return np.dtype(np.uint16) if kv_dtype == "bfloat16" else np.dtype(kv_dtype)


@dataclass(frozen=True, slots=True)
class Quantization:
    """The weight-only method of the dense linear layers and of the MoE experts (None: stored in the dtype)."""

    dense: str | None = None
    moe: str | None = None

    @property
    def name(self) -> str:
        """FastDeploy's spelling: "" (none), "wint8", "wint4", or "mix_quant(dense=...,moe=...)"."""
        if self.dense is None and self.moe is None:
            return ""
        if self.dense == self.moe:
            return self.dense
        return f"mix_quant(dense={self.dense},moe={self.moe})"

    def for_model(self, has_experts: bool) -> Quantization:
        """What a plain "wint4" means on this model: on ERNIE MoE dense WINT8 + experts WINT4 (FastDeploy)."""
        if has_experts and self.dense == "wint4" and self.moe == "wint4" and self._plain:
            return Quantization("wint8", "wint4", _plain=False)
        return self

    # given as one name ("wint4"), so for_model may read it as mix_quant; not part of equality
    _plain: bool = field(default=True, compare=False, repr=False)


NONE = Quantization()


def parse_quantization(value) -> Quantization:
    """--quantization's value: None / "" / "none", "wint8", "wint4", or the JSON form (a dict or its text) with
    'quantization' and, for mix_quant, 'dense_quant_type' and 'moe_quant_type'. Raises ValueError naming the field."""
    if isinstance(value, Quantization):
        return value
    if value is None or value == "" or value == "none":
        return NONE
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"field 'quantization' is not valid JSON: {e}") from None
    if isinstance(value, str):
        if value not in WEIGHT_ONLY:
            raise ValueError(f"field 'quantization' must be one of {', '.join(WEIGHT_ONLY)} (or FastDeploy's JSON "
                             f"form), got {value!r}")
        return Quantization(value, value)
    if not isinstance(value, dict):
        raise ValueError(f"field 'quantization' must be a string or a JSON object, got {type(value).__name__}")
    unknown = set(value) - {"quantization", "dense_quant_type", "moe_quant_type"}
    if unknown:
        raise ValueError(f"field 'quantization.{sorted(unknown)[0]}' is not supported (known: quantization, "
                         f"dense_quant_type, moe_quant_type)")
    method = value.get("quantization")
    if method == "mix_quant":
        dense, moe = value.get("dense_quant_type"), value.get("moe_quant_type")
        for name, v in (("dense_quant_type", dense), ("moe_quant_type", moe)):
            if v not in WEIGHT_ONLY:
                raise ValueError(f"field 'quantization.{name}' must be one of {', '.join(WEIGHT_ONLY)}, got {v!r}")
        return Quantization(dense, moe, _plain=False)
    if method in WEIGHT_ONLY and set(value) == {"quantization"}:
        return Quantization(method, method)
    raise ValueError(f"field 'quantization.quantization' must be one of {', '.join(WEIGHT_ONLY)} or 'mix_quant' "
                     f"(with dense_quant_type and moe_quant_type), got {method!r}")


@dataclass(frozen=True, slots=True)
class Precision:
    """What a model is built in: the dtype of the unquantized weights and the weight-only methods."""

    dtype: str = "float32"
    quantization: Quantization = NONE

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"field 'dtype' must be one of {', '.join(DTYPES)} (or auto), got {self.dtype!r}")
        if self.dtype == "float64" and self.quantization != NONE:
            raise ValueError("field 'quantization' needs dtype bfloat16, float16 or float32, not float64")

    @property
    def compute_dtype(self) -> str:
        """The activations' dtype (float64 only for the exactness tests); the KV cache's is the config's
        (`resolve_kv_cache_dtype`)."""
        return "float64" if self.dtype == "float64" else "float32"

    def describe(self) -> str:
        return self.dtype + (f", {self.quantization.name}" if self.quantization.name else "")

