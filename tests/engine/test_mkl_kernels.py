"""`import fastdeploy` selects MKL's AVX2 kernels on AMD processors (MKL_DEBUG_CPU_TYPE=5, fastdeploy/__init__.py;
measured in benchmarks/cpu_gemm.py), only there, and never over the user's own value."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastdeploy import mkl_cpu_type_for

AMD = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n"
INTEL = "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n"
OLD_AMD = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 sse4_2 avx\n"


@pytest.mark.parametrize("cpuinfo, wanted", [(AMD, "5"), (INTEL, None), (OLD_AMD, None)])
def test_avx2_kernels_only_on_amd_with_avx2(cpuinfo, wanted):
    assert mkl_cpu_type_for(cpuinfo) == wanted


def imported_value(env: dict) -> str:
    code = "import os, fastdeploy; print(os.environ.get('MKL_DEBUG_CPU_TYPE', 'unset'))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_users_value_wins_and_this_machine_gets_its_own():
    assert imported_value(dict(os.environ, MKL_DEBUG_CPU_TYPE="4")) == "4"
    clean = {k: v for k, v in os.environ.items() if k != "MKL_DEBUG_CPU_TYPE"}
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
        wanted = mkl_cpu_type_for(cpuinfo.read(8192))
    assert imported_value(clean) == (wanted or "unset")
