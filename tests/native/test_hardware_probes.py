"""The hardware probes H1-H5 (XPU3_KERNEL_MODEL §14) run on the emulator, where the emulator's assumed outcome is
the expected one; on a P800 (vendor build) the same runner reports the chip's answers (docs/kunlun3.md)."""

import subprocess
import sys

import pytest

from fastdeploy.model_executor.ops import _kl3_pybind
from tests.native.kl3_build_module import XPU_OPS

pytestmark = pytest.mark.emulator


@pytest.mark.skipif(_kl3_pybind.VENDOR_BUILD, reason="a vendor build runs the probes on the chip (self-check)")
def test_every_probe_observes_the_emulators_assumption():
    """XPU3_KERNEL_MODEL §14 on the emulator: H1 poison before the fence, H2 poisoned SM at kernel start, H4 the
    project budgets, H5 strict failure and compat pass; H3 is not applicable (no SIMD)."""
    results = {r["id"]: r for r in _kl3_pybind.run_probes()}
    assert list(results) == ["H1", "H2", "H3", "H4", "H5"]
    for r in results.values():
        assert r["matches_emulator"], r
        assert r["observation"] and r["emulator_assumes"] and r["question"]
    assert results["H3"]["status"] == "not applicable"
    assert all(results[i]["status"] == "observed" for i in ("H1", "H2", "H4", "H5"))
    assert "largest that ran: shared 32 KiB, local 4 KiB" in results["H4"]["observation"]


def test_probes_can_be_selected_and_keep_their_order():
    """H5 (the probe that may hang on hardware) always runs last (XPU3_KERNEL_MODEL §14)."""
    assert [r["id"] for r in _kl3_pybind.run_probes(["H5", "H1"])] == ["H1", "H5"]


def test_probe_kernels_use_only_registered_intrinsics():
    """XPU3_KERNEL_MODEL §12.3: the probes obey the same intrinsic registry as the op kernels."""
    tool = XPU_OPS / "emulator" / "tools" / "check_intrinsics.py"
    result = subprocess.run([sys.executable, str(tool), str(XPU_OPS / "probes" / "kernels")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_probe_kernels_are_warning_free_cxx11():
    """XPU3_KERNEL_MODEL §10: the probes obey the kernel dialect rules (C++11, warning-free), like the op kernels."""
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    kernel_include = XPU_OPS / "src" / "plugin" / "src" / "kernel" / "include"
    for src in sorted((XPU_OPS / "probes" / "kernels").glob("*.xpu")):
        proc = subprocess.run(
            ["g++", "-x", "c++", "-std=c++11", "-fsyntax-only", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
             "-DKL3_EMULATION", "-include", "kl3_emu.h", f"-I{XPU_OPS / 'emulator' / 'include'}",
             f"-I{kernel_include}", str(src)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{src.name}:\n{proc.stderr}"
