"""The op layer's placement rules and XPU device binding (OPS §2.2, docs/kunlun3.md "XPU tensors") run here with
hand-built tensor arguments: mixed host/device and two-device calls are refused naming the argument, host-only
arguments must be host tensors, XPU tensors bind the framework's device context (stream, cluster count), and a
build without PADDLE_WITH_XPU refuses them as not implemented. Paddle's CPU build has no XPU place, so this
driver is what exercises those lines without a device."""

import shutil
import subprocess

import pytest

from tests.native.kl3_build_module import ROOT, XPU_OPS

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


def test_placement_rules_and_device_binding(tmp_path):
    binary = tmp_path / "placement"
    sources = [ROOT / "tests" / "native" / "placement_main.cpp", XPU_OPS / "src" / "ops" / "common" / "op_args.cc",
               XPU_OPS / "src" / "plugin" / "src" / "wrapper" / "kl3" / "context.cpp"]
    build = subprocess.run(["g++", "-std=c++17", "-O0", "-Wall", "-Werror", f"-I{XPU_OPS / 'src' / 'ops'}",
                            f"-I{XPU_OPS / 'src' / 'plugin' / 'include'}", *map(str, sources), "-o", str(binary)],
                           capture_output=True, text=True, timeout=180)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip().endswith("placement checks passed"), run.stdout
