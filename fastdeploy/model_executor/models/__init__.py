"""Registry of the models: `get_model(name_or_path, dtype)` returns a ready-to-run Model: an embedded model by
name, or a checkpoint directory's model by its config.json's `architectures[0]` (ARCHITECTURES).

`Model` and `ForwardBatch` (which need Paddle) are imported on first use, so the API server can import
`fastdeploy.model_executor.models.tokenizer` without loading Paddle.
"""
from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from fastdeploy.model_executor.models.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from fastdeploy.model_executor.models.base import Model

__all__ = ["ForwardBatch", "Model", "ByteTokenizer", "get_model", "MODEL_NAMES", "ARCHITECTURES", "is_checkpoint"]


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


# config.json architecture -> "module:class" of its model file (imported on use: Paddle)
ARCHITECTURES = {
    "Ernie4_5ForCausalLM": "fastdeploy.model_executor.models.ernie4_5:Ernie4_5ForCausalLM",
    "Ernie4_5_MoeForCausalLM": "fastdeploy.model_executor.models.ernie4_5_moe:Ernie4_5_MoeForCausalLM",
    "Qwen3ForCausalLM": "fastdeploy.model_executor.models.qwen3:Qwen3ForCausalLM",
    "Qwen2ForCausalLM": "fastdeploy.model_executor.models.qwen2:Qwen2ForCausalLM",
    "LlamaForCausalLM": "fastdeploy.model_executor.models.llama:LlamaForCausalLM",
}


# the architectures whose model file has an MTP module, named here so the API server can check a launch without
# importing Paddle
MTP_ARCHITECTURES = ("Ernie4_5_MoeForCausalLM",)


def is_checkpoint(name_or_path: str) -> bool:
    """True when `name_or_path` names a checkpoint directory rather than an embedded model."""
    return name_or_path not in _REGISTRY and os.path.isdir(name_or_path)


def check_architecture(architecture: str, path) -> None:
    """ValueError (one line) unless `architecture` is one get_model serves."""
    from fastdeploy.model_executor.models.checkpoint import CheckpointError
    if architecture not in ARCHITECTURES:
        raise CheckpointError(f"checkpoint '{path}': architecture {architecture!r} (config.json 'architectures') "
                              f"is not supported; supported: {', '.join(ARCHITECTURES)}")


def check_speculative(config, speculative) -> None:
    """CheckpointError (one line) unless checkpoint `config` (a CheckpointConfig) can serve `speculative` (a
    SpeculativeConfig or None): with K >= 1 its architecture must have an MTP module and MTP weights must be
    found, in `speculative.model` when given, else in the checkpoint. Reads headers only (no Paddle)."""
    from fastdeploy.model_executor.models.checkpoint import CheckpointError, read_checkpoint_config
    k = speculative.num_speculative_tokens if speculative is not None else 0
    if not k:
        return
    if config.architecture not in MTP_ARCHITECTURES:
        raise CheckpointError(f"checkpoint '{config.path}': {config.architecture} has no MTP weights (the "
                              f"architecture has no MTP module): speculative method 'mtp' with "
                              f"num_speculative_tokens {k} needs one; MTP is supported for "
                              f"{', '.join(MTP_ARCHITECTURES)}")
    if speculative.model is not None:
        if not read_checkpoint_config(speculative.model).has_mtp_weights:
            raise CheckpointError(f"checkpoint '{speculative.model}': no MTP weights (no 'mtp_*' tensors) in the "
                                  f"speculative config's 'model'")
    elif not config.has_mtp_weights:
        raise CheckpointError(f"checkpoint '{config.path}': MTP was asked for but the checkpoint has no MTP weights "
                              f"(no 'mtp_*' tensors); give their directory as --speculative-config "
                              f"'{{\"method\": \"mtp\", \"model\": PATH}}'")


def get_model(name_or_path: str, dtype: str = "float32", speculative=None, quantization=None, **options) -> Model:
    """The embedded model `name_or_path` ("fd-toy" or "fd-tiny"; options go to its constructor: fd-toy eos_rate,
    mtp_agreement; fd-tiny weights_path), or the model of the checkpoint directory `name_or_path` (its weights
    cast to `dtype`, its tokenizer, its EOS ids; `name` is the path as given). A bad checkpoint raises
    CheckpointError (a ValueError) with one line naming the directory and what is wrong.

    `speculative` (a config.SpeculativeConfig or None): with K >= 1 a checkpoint's MTP module is loaded, from
    `speculative.model` when set, else from the checkpoint itself; an architecture without one, or a checkpoint
    without MTP weights, is refused (CheckpointError). The embedded models carry their MTP module built in.

    `dtype` ("auto" resolved: fastdeploy/precision.py) and `quantization` (None, "wint8", "wint4" or FastDeploy's
    JSON form) are the checkpoint's precision; the MTP module takes `speculative.quantization` when set. The
    embedded models are float32 (or float64) only."""
    from fastdeploy.precision import DTYPES, parse_quantization
    if dtype not in DTYPES:
        raise ValueError(f"get_model: argument 'dtype' must be one of {', '.join(DTYPES)}, got {dtype!r}")
    quantization = parse_quantization(quantization)
    k = speculative.num_speculative_tokens if speculative is not None else 0
    mtp_model = speculative.model if speculative is not None else None
    if name_or_path in _REGISTRY:
        if mtp_model is not None:
            raise ValueError(f"get_model: {name_or_path} has its MTP module built in; the speculative config's "
                             f"'model' ({mtp_model!r}) is for checkpoint directories")
        if dtype not in ("float32", "float64") or quantization.name:
            raise ValueError(f"get_model: argument 'dtype' ({dtype!r}) / 'quantization': {name_or_path} is served "
                             f"in float32 (or float64) only; --dtype and --quantization are for checkpoint "
                             f"directories")
        return _REGISTRY[name_or_path](dtype, **options)
    if not isinstance(name_or_path, str) or not os.path.isdir(name_or_path):
        raise ValueError(f"get_model: argument 'name' must be one of {MODEL_NAMES} or a checkpoint directory, "
                         f"got {name_or_path!r}")
    if options:
        raise ValueError(f"get_model: a checkpoint takes no model options, got {sorted(options)}")
    from fastdeploy.model_executor.models.checkpoint import read_checkpoint_config
    from fastdeploy.model_executor.models.tokenizer import get_tokenizer
    config = read_checkpoint_config(name_or_path)
    check_architecture(config.architecture, config.path)
    tokenizer = get_tokenizer(name_or_path)
    module, cls = ARCHITECTURES[config.architecture].split(":")
    model_cls = getattr(importlib.import_module(module), cls)
    check_speculative(config, speculative)
    mtp = {"mtp": True, "mtp_model": mtp_model, "mtp_quantization": speculative.quantization} if k else {}
    return model_cls(config, dtype=dtype, name=name_or_path, tokenizer=tokenizer, quantization=quantization, **mtp)
