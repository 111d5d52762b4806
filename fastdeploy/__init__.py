"""FastDeploy PD + MTP slice. `LLM` and `SamplingParams` are imported on first use, so `import fastdeploy` loads
neither paddle nor the native ops."""
from __future__ import annotations

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from fastdeploy.entrypoints.llm import LLM
        return LLM
    if name == "SamplingParams":
        from fastdeploy.schema.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'fastdeploy' has no attribute {name!r}")
