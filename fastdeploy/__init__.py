"""FastDeploy PD + MTP slice. `LLM` and `SamplingParams` are imported on first use, so `import fastdeploy` loads
neither paddle nor the native ops."""
from __future__ import annotations

import warnings

# `import paddle` warns that ccache is missing, which matters only to JIT-compiled extensions (this project builds
# its native ops ahead of time): silenced in every process that imports fastdeploy, before any of them loads Paddle.
warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from fastdeploy.entrypoints.llm import LLM
        return LLM
    if name == "SamplingParams":
        from fastdeploy.schema.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'fastdeploy' has no attribute {name!r}")
