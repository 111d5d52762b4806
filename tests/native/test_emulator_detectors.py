"""The Kunlun3 host emulator's detectors flag deliberately broken kernels (XPU3_KERNEL_MODEL §12.1, OPS §7, §8 C4).

Builds the toy-kernel driver (tests/native/toy_kernels.xpu) with CMake into a temporary directory, plain and with
ThreadSanitizer, and checks that strict mode or the sanitizer flags every toy while the correct control kernel
runs clean. Also checks the intrinsic registry checker and the C++11 dialect of the project's kernel sources.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from toolchain import have_cmake_and_gxx, sanitizer_runs

ROOT = Path(__file__).resolve().parents[2]
EMULATOR = ROOT / "custom_ops" / "xpu_ops" / "emulator"
KERNELS = ROOT / "custom_ops" / "xpu_ops" / "src" / "plugin" / "src" / "kernel"
CHECKER = EMULATOR / "tools" / "check_intrinsics.py"

pytestmark = pytest.mark.skipif(not have_cmake_and_gxx(), reason="needs cmake and g++ to build the emulator")

# The ThreadSanitizer toys need libtsan; they belong to the sanitizer group (-m "not sanitizers" deselects them).
requires_tsan = pytest.mark.skipif(not sanitizer_runs("-fsanitize=thread"),
                                   reason="g++ cannot build and run TSan programs here (libtsan missing)")


@pytest.fixture(scope="module")
def toy_driver(tmp_path_factory):
    """Paths of the plain and the ThreadSanitizer toy-kernel drivers."""
    build = tmp_path_factory.mktemp("kl3_toys")
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                   check=True, capture_output=True)
    targets = ["kl3_toy_kernels"] + (["kl3_toy_kernels_tsan"] if sanitizer_runs("-fsanitize=thread") else [])
    subprocess.run(["cmake", "--build", str(build), "-j2", "--target", *targets], check=True, capture_output=True)
    return {"plain": build / "kl3_toy_kernels", "tsan": build / "kl3_toy_kernels_tsan"}


def run_toy(driver, toy, *options):
    proc = subprocess.run([str(driver), toy, *options], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("options", [(), ("--eager",), ("--compat-barrier", "--simple-dma")])
def test_correct_control_kernel_runs_clean_in_every_mode(toy_driver, options):
    """A race-free kernel with a fenced, uniform barrier is never flagged (XPU3_KERNEL_MODEL §12.1)."""
    rc, out = run_toy(toy_driver["plain"], "control", *options)
    assert rc == 0 and "CLEAN" in out, out


STRICT_FLAGS = [
    ("missing_barrier", "never written since the cluster started"),
    ("exited_cores_barrier", "non-uniform barrier"),
    ("branch_barrier", "core-specific branch"),
    ("out_of_bounds_dma", "outside every GM buffer registered"),
    ("async_read_before_fence", "value read before mfence"),
    ("async_pending_at_exit", "_ASYNC copies still pending"),
    ("shared_read_before_write", "never written since the cluster started"),
    ("shared_over_budget", "exceeds the shared-memory budget"),
    ("local_over_budget", "exceeds the local-memory budget"),
    ("slow_core_barrier", "barrier wait timed out"),
]


@pytest.mark.parametrize("toy, diagnostic", STRICT_FLAGS, ids=[t for t, _ in STRICT_FLAGS])
def test_strict_mode_flags_broken_kernel(toy_driver, toy, diagnostic):
    """Each broken toy fails its launch (or its result) in strict mode, with a diagnostic naming the problem
    (XPU3_KERNEL_MODEL §12.1 barrier, GM registry, SM poison/budget, LM budget, strict _ASYNC DMA; OPS §7 D1, D15)."""
    rc, out = run_toy(toy_driver["plain"], toy)
    assert rc == 1 and out.startswith("FLAGGED"), out
    assert diagnostic in out, out


def test_deadlock_report_names_waiting_and_running_cores(toy_driver):
    """A barrier wait that times out reports which cores wait where and which are still running (XPU3_KERNEL_MODEL §12.1
    E3)."""
    _, out = run_toy(toy_driver["plain"], "slow_core_barrier")
    # Under load the first waiter may time out before every other core has arrived, so only the slow core's
    # place in the report is fixed.
    assert re.search(r"cores? 0[-\d, ]* waits? at \S*toy_kernels\.xpu:\d+", out), out
    assert re.search(r"(core 63 is|cores [-\d, ]*63 are) still running", out), out


def test_compat_mode_counts_exited_cores_as_arrived(toy_driver):
    """Compat mode runs FastDeploy's barrier-after-return pattern (OPS §7 D1) that strict mode rejects
    (XPU3_KERNEL_MODEL §3)."""
    rc, out = run_toy(toy_driver["plain"], "exited_cores_barrier", "--compat-barrier")
    assert rc == 0 and "CLEAN" in out, out


def test_simple_dma_mode_would_hide_a_missing_fence(toy_driver):
    """Only strict _ASYNC delivery exposes a read before mfence (OPS §7 D15): simple mode copies at issue."""
    rc, out = run_toy(toy_driver["plain"], "async_read_before_fence", "--simple-dma")
    assert rc == 0 and "CLEAN" in out, out


@pytest.mark.sanitizers
@requires_tsan
def test_thread_sanitizer_reports_missing_barrier_race(toy_driver):
    """With every core on its own thread, a missing barrier is always flagged: by ThreadSanitizer when the other
    cores' stores race with core 0's read, or by the poison check when core 0 reads first (OPS §8 C4). Which one
    fires depends on thread timing, so the toy is run a few times and ThreadSanitizer must fire at least once."""
    tsan_reports = 0
    for _ in range(4):
        rc, out = run_toy(toy_driver["tsan"], "missing_barrier")
        race = "WARNING: ThreadSanitizer: data race" in out
        assert race or "FLAGGED" in out, out
        assert rc != 0, out
        tsan_reports += race
        if tsan_reports:
            break
    assert tsan_reports > 0, "ThreadSanitizer never reported the missing-barrier race"


@pytest.mark.sanitizers
@requires_tsan
def test_thread_sanitizer_reports_cores_writing_the_same_element(toy_driver):
    """Several cores writing one element (OPS §7 D14) is invisible to strict mode but a ThreadSanitizer race."""
    rc, out = run_toy(toy_driver["plain"], "racy_slot_writes")
    assert rc == 0 and "CLEAN" in out, out
    rc, out = run_toy(toy_driver["tsan"], "racy_slot_writes")
    assert "WARNING: ThreadSanitizer: data race" in out and rc != 0, out


@pytest.mark.sanitizers
@requires_tsan
def test_thread_sanitizer_is_silent_on_correct_kernel(toy_driver):
    """The emulator's own synchronisation (pool, barrier) is race-free under ThreadSanitizer."""
    rc, out = run_toy(toy_driver["tsan"], "control")
    assert rc == 0 and "ThreadSanitizer" not in out, out


def test_intrinsic_checker_accepts_project_kernels():
    """Every identifier the project's kernels use is C++ or registered (XPU3_KERNEL_MODEL §12.3 E10)."""
    proc = subprocess.run([sys.executable, str(CHECKER)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_intrinsic_checker_rejects_unregistered_primitives(tmp_path):
    """SIMD, atomics and raw __shared__ are not registered, so a kernel using them fails the check
    (XPU3_KERNEL_MODEL §12.3)."""
    bad = tmp_path / "bad.xpu"
    bad.write_text(
        "__global__ void k(int* p) {\n"
        "  __shared__ int x[4];\n"
        "  int32x16_t v = vload_lm(p);\n"
        "  atomicadd(p, 1);\n"
        "}\n"
    )
    proc = subprocess.run([sys.executable, str(CHECKER), str(bad)], capture_output=True, text=True)
    assert proc.returncode == 1
    for name in ("__shared__", "vload_lm", "atomicadd"):
        assert f"'{name}'" in proc.stdout, proc.stdout


def test_kernel_sources_are_warning_free_cxx11():
    """The .xpu files compile as C++11 with -Wall -Wextra -Werror against the dialect (XPU3_KERNEL_MODEL §10)."""
    sources = sorted(KERNELS.rglob("*.xpu"))
    assert sources
    for src in sources:
        proc = subprocess.run(
            ["g++", "-x", "c++", "-std=c++11", "-fsyntax-only", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
             "-DKL3_EMULATION", "-include", "kl3_emu.h", f"-I{EMULATOR / 'include'}", f"-I{KERNELS / 'include'}",
             str(src)],
            capture_output=True, text=True,
        )
        assert proc.returncode == 0, f"{src.name}:\n{proc.stderr}"
