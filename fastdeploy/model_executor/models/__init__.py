"""Registry of the embedded models: `get_model(name, dtype)` returns a ready-to-run Model.

`Model` and `ForwardBatch` (which need Paddle) are imported on first use, so the API server can import
`fastdeploy.model_executor.models.tokenizer` without loading Paddle.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fastdeploy.model_executor.models.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from fastdeploy.model_executor.models.base import Model

__all__ = ["ForwardBatch", "Model", "ByteTokenizer", "get_model", "MODEL_NAMES"]


def __getattr__(name: str):
    if name in ("ForwardBatch", "Model"):
        from fastdeploy.model_executor.models import base
        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _fd_toy(dtype: str, **options) -> Model:
    from fastdeploy.model_executor.models.fd_toy import FdToy
    return FdToy(dtype=dtype, **options)


def _fd_tiny(dtype: str, **options) -> Model:
    from fastdeploy.model_executor.models.fd_tiny import FdTiny
    return FdTiny.from_pretrained(dtype=dtype, **options)


_REGISTRY = {"fd-toy": _fd_toy, "fd-tiny": _fd_tiny}
MODEL_NAMES = tuple(_REGISTRY)


def get_model(name: str, dtype: str = "float32", **options) -> Model:
    """The model registered as `name` ("fd-toy" or "fd-tiny"); options go to its constructor
    (fd-toy: eos_rate, mtp_agreement; fd-tiny: weights_path)."""
    if name not in _REGISTRY:
        raise ValueError(f"get_model: argument 'name' must be one of {MODEL_NAMES}, got {name!r}")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"get_model: argument 'dtype' must be 'float32' or 'float64', got {dtype!r}")
    return _REGISTRY[name](dtype, **options)
