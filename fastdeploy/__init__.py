"""FastDeploy PD + MTP slice. `LLM` and `SamplingParams` are imported on first use, so `import fastdeploy` loads
neither paddle nor the native ops."""
from __future__ import annotations

import os
import warnings

# `import paddle` warns that ccache is missing, which matters only to JIT-compiled extensions (this project builds
# its native ops ahead of time): silenced in every process that imports fastdeploy, before any of them loads Paddle.
warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)


def _mkl_avx2_on_amd() -> None:
    """Paddle's CPU wheel bundles an MKL (mklml) whose CPU dispatch gives AMD processors its generic code path: a
    float32 GEMM runs at about a third of the AVX2 path's speed (docs/benchmarks.md "Real shapes"). That MKL honours
    MKL_DEBUG_CPU_TYPE=5 (use the AVX2 kernels), read at its first call, so it is set here, before any process of
    ours does math. Only on AMD (Intel processors get their best path anyway) and never over the user's own value."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            head = cpuinfo.read(4096)
    except OSError:
        return
    if "AuthenticAMD" in head and " avx2" in head:
        os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")


_mkl_avx2_on_amd()

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from fastdeploy.entrypoints.llm import LLM
        return LLM
    if name == "SamplingParams":
        from fastdeploy.schema.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'fastdeploy' has no attribute {name!r}")
