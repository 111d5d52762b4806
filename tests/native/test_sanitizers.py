"""Every emulated kernel and every CPU path runs clean under ASan+UBSan, and the emulated kernels under TSan
(OPS §8 C4, XPU3_KERNEL_MODEL §12.1).

Runs tests/native/run_sanitizers.sh, which builds the native drivers with CMake (-j2, a few minutes on two cores)
and requires zero sanitizer reports, kernel == CPU path at 1, 2 and 12 clusters inside guard bands, and every
broken toy kernel flagged. Deselect with `-m "not sanitizers"` for a quick local run; CI runs it.
"""

import os
import subprocess
from pathlib import Path

import pytest
from toolchain import have_cmake_and_gxx, sanitizer_runs

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "native" / "run_sanitizers.sh"

pytestmark = [
    pytest.mark.sanitizers,
    pytest.mark.skipif(not have_cmake_and_gxx(), reason="needs cmake and g++ to build the sanitizer drivers"),
    pytest.mark.skipif(not (sanitizer_runs("-fsanitize=address,undefined") and sanitizer_runs("-fsanitize=thread")),
                       reason="g++ cannot build and run ASan/UBSan and TSan programs here (libasan/libtsan missing)"),
]


@pytest.mark.timeout(600)   # three sanitizer builds: ~1.5 min alone, several on two busy cores
def test_kernels_and_cpu_paths_are_clean_under_asan_ubsan_and_tsan(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=570,
                          env={**os.environ, "KL3_SANITIZER_BUILD_DIR": str(tmp_path / "build")})
    summary = proc.stdout[proc.stdout.rfind("== summary"):] if "== summary" in proc.stdout else proc.stdout[-4000:]
    assert proc.returncode == 0 and "SANITIZERS: OK" in proc.stdout, summary + proc.stderr[-2000:]

