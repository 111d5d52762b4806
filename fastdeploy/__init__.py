"""FastDeploy PD + MTP slice. `LLM` and `SamplingParams` are imported on first use, so `import fastdeploy` loads
neither paddle nor the native ops."""
from __future__ import annotations

import os
import warnings

# `import paddle` warns that ccache is missing, which matters only to JIT-compiled extensions (this project builds
# its native ops ahead of time): silenced in every process that imports fastdeploy, before any of them loads Paddle.
warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)


def mkl_cpu_type_for(cpuinfo: str) -> str | None:
    """Paddle's CPU wheel bundles an MKL (mklml) whose CPU dispatch gives AMD processors its generic code path: a
    float32 GEMM runs at a third to two thirds of the AVX2 path's speed (benchmarks/cpu_gemm.py). That MKL honours
    MKL_DEBUG_CPU_TYPE=5 (use the AVX2 kernels), read at its first call: the value for this processor, or None
    where the default is right (Intel processors get their best path anyway; no AVX2, no AVX2 kernels)."""
    return "5" if "AuthenticAMD" in cpuinfo and " avx2" in cpuinfo else None


def _select_mkl_kernels() -> None:
    """Set before any process of ours does math, never over the user's own value."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            head = cpuinfo.read(8192)   # the first processor's vendor and flags
    except OSError:
        return
    cpu_type = mkl_cpu_type_for(head)
    if cpu_type is not None:
        os.environ.setdefault("MKL_DEBUG_CPU_TYPE", cpu_type)


_select_mkl_kernels()

# Two OpenMP runtimes share the process: Paddle's kernels, its MKL and its oneDNN run on Intel's (libiomp5, which
# also answers GCC's GOMP_* calls: libphi and libdnnl bind to it), the project's CPU ops on GCC's (libgomp), each
# with a team of OMP_NUM_THREADS. Intel's workers spin for KMP_BLOCKTIME (200 ms by default) after each of its
# parallel regions, taking the cores GCC's team then needs wherever there are no more cores than threads: 0 puts
# them to sleep at once (read at Intel's first parallel region; never over the user's own value). Measured:
# benchmarks/openmp_blocktime.py, docs/benchmarks.md "OpenMP block time" (also what one runtime for both cost).
os.environ.setdefault("KMP_BLOCKTIME", "0")

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from fastdeploy.entrypoints.llm import LLM
        return LLM
    if name == "SamplingParams":
        from fastdeploy.schema.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'fastdeploy' has no attribute {name!r}")
