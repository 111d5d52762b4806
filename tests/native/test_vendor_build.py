"""The vendor branch of the build (XPU3_KERNEL_MODEL §10) exercised with a fake toolchain: a CLANG_PATH whose
bin/clang++ records the commands it is given. It checks what setup.py would run on a P800 machine, not that XTDK
accepts it (docs/kunlun3.md, "What awaits hardware")."""

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tests.native.kl3_build_module import XPU_OPS, load_kl3_build, load_setup

# XPU3_KERNEL_MODEL §10, kernel and wrapper flags, verbatim.
KERNEL_FLAGS = ["-std=c++11", "-O2", "--xpu-arch=xpu3", "-D", "__XPU3__", "-fno-builtin", "-fPIC", "-Werror",
                "-Wno-int-to-void-pointer-cast", "-Wno-int-to-pointer-cast", "-mllvm", "-fix-mfence=all", "-mllvm",
                "--xpu-inline-cost", "-mllvm", "--xpu-inline-hot-call", "-fxpu-launch-return"]
WRAPPER_FLAGS = ["-std=c++11", "-O2", "-x", "xpu", "--xpu-host-only", "-c", "-D_GNU_SOURCE", "-D__STDC_LIMIT_MACROS",
                 "-DNDEBUG", "-fPIC", "-Werror", "-Wreorder", "-Wunused-variable", "-fvisibility=hidden"]


@pytest.fixture
def fake_sdk(tmp_path):
    """A fake XTDK root (bin/clang++ logs its argv as JSON lines and creates the outputs) and SDK directories."""
    log = tmp_path / "clang.log"
    clang = tmp_path / "xtdk" / "bin" / "clang++"
    clang.parent.mkdir(parents=True)
    clang.write_text(f"""#!{sys.executable}
import json, sys, pathlib
args = sys.argv[1:]
with open({str(log)!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
out = pathlib.Path(args[args.index("-o") + 1])
out.write_bytes(b"")
if "--basename" in args:
    out.with_name(out.name[:-2] + ".device.bin.o").write_bytes(b"")
""")
    clang.chmod(clang.stat().st_mode | stat.S_IEXEC)
    env = {"CLANG_PATH": str(tmp_path / "xtdk")}
    for name in ("XDNN_INC_DIR", "XDNN_LIB_DIR", "XRE_INC_DIR", "XRE_LIB_DIR"):
        (tmp_path / name).mkdir()
        env[name] = str(tmp_path / name)
    return env, log


def _subsequence(flags, command):
    """True if `flags` occur in `command` in this order, contiguously."""
    return any(command[i:i + len(flags)] == flags for i in range(len(command) - len(flags) + 1))


def test_vendor_build_compiles_every_kernel_and_wrapper_with_the_section_10_flags(fake_sdk, tmp_path):
    """XPU3_KERNEL_MODEL §10: every .xpu (op kernels and probes) through XTDK clang with the kernel flags,
    --target and --basename; every wrapper host-only with the wrapper flags; all with the vendor switches."""
    env, log = fake_sdk
    kl3_build = load_kl3_build()
    tc = kl3_build.vendor_toolchain(env, paddle_with_xpu=True)
    setup = load_setup()
    builder = setup["BuildNativeOps"].__new__(setup["BuildNativeOps"])
    builder.vendor = tc

    class Spawner:
        def spawn(self, command):
            os.spawnv(os.P_WAIT, command[0], command)

    builder.compiler = Spawner()
    objects = builder._build_vendor_objects(tmp_path / "out")
    commands = [json.loads(line) for line in log.read_text().splitlines()]
    kernels = kl3_build.sources("KERNEL_DIRS")
    wrappers = kl3_build.sources("WRAPPER_DIRS")
    assert {k.name for k in kernels} >= {"speculate_update.xpu", "h1_async_fence.xpu", "h5_exit_barrier.xpu"}
    assert len(commands) == len(kernels) + len(wrappers)
    for kernel, command in zip(kernels, commands):
        assert _subsequence(KERNEL_FLAGS, command), command
        assert "--target=x86_64-baidu-linux-gnu" in command
        assert command[command.index("--basename") + 1].endswith(f"xpu3_{kernel.stem}")
        assert command[command.index("-c") + 1] == str(kernel)
        assert "-DKL3_VENDOR_BUILD" in command and f"-I{env['XDNN_INC_DIR']}" in command
    for wrapper, command in zip(wrappers, commands[len(kernels):]):
        assert _subsequence(WRAPPER_FLAGS, command), command
        assert str(wrapper) in command and "-DKL3_VENDOR_BUILD" in command
    assert len(objects) == 2 * len(kernels) + len(wrappers)
    assert all(Path(o).exists() for o in objects)


def test_vendor_extensions_take_paddle_with_xpu_and_link_the_kunlun_runtime(fake_sdk):
    """The Paddle extension gets PADDLE_WITH_XPU and both extensions the vendor switches, the SDK includes and
    -lxpuapi -lxpurt; without the vendor toolchain the host flags are unchanged (same as today's build)."""
    env, _ = fake_sdk
    kl3_build = load_kl3_build()
    tc = kl3_build.vendor_toolchain(env, paddle_with_xpu=True)
    toolchain_args = load_setup()["_toolchain_args"]
    compile_args, library_dirs, link_args = toolchain_args("fastdeploy.model_executor.ops._paddle_ops", tc)
    assert {"-DPADDLE_WITH_XPU", "-DKL3_VENDOR_BUILD", "-DKL3_WITH_KERNELS"} <= set(compile_args)
    assert f"-I{env['XRE_INC_DIR']}" in compile_args
    assert {"-lxpuapi", "-lxpurt", f"-L{env['XDNN_LIB_DIR']}"} <= set(link_args)
    assert env["XRE_LIB_DIR"] in library_dirs
    pybind_args = toolchain_args("fastdeploy.model_executor.ops._kl3_pybind", tc)[0]
    assert "-DKL3_VENDOR_BUILD" in pybind_args and "-DPADDLE_WITH_XPU" not in pybind_args
    host_args = toolchain_args("fastdeploy.model_executor.ops._paddle_ops")
    assert "-DPADDLE_WITH_XPU" not in host_args[0] and "-lxpurt" not in host_args[2]
    assert not any(str(p).startswith(str(XPU_OPS / "emulator" / "src")) for p in load_setup()["_plugin_sources"](True))


@pytest.mark.parametrize("change, variable", [
    ({"XDNN_INC_DIR": None}, "XDNN_INC_DIR or XPU_INC_DIR"),
    ({"XDNN_LIB_DIR": "/nonexistent/lib"}, "XDNN_LIB_DIR"),
    ({"CLANG_PATH": "/nonexistent/xtdk"}, "CLANG_PATH"),
])
def test_an_incomplete_vendor_environment_is_refused_naming_the_variable(fake_sdk, change, variable):
    """docs/kunlun3.md "Building": a vendor build with a missing or wrong location fails before compiling, naming
    the environment variable."""
    env, _ = fake_sdk
    env = {k: v for k, v in {**env, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=variable):
        load_kl3_build().vendor_toolchain(env, paddle_with_xpu=True)


def test_vendor_build_needs_paddle_compiled_with_xpu_and_is_off_without_clang_path(fake_sdk):
    """The vendor branch is chosen only where paddle.is_compiled_with_xpu(); with no CLANG_PATH the host build
    is used (this machine)."""
    env, _ = fake_sdk
    kl3_build = load_kl3_build()
    with pytest.raises(ValueError, match="not compiled with XPU"):
        kl3_build.vendor_toolchain(env, paddle_with_xpu=False)
    assert kl3_build.vendor_toolchain({}, paddle_with_xpu=True) is None


def test_p800_install_script_refuses_a_paddle_without_xpu_before_installing_anything(fake_sdk, tmp_path):
    """docs/kunlun3.md "On a P800": the install script checks paddle.is_compiled_with_xpu() first; here (CPU
    wheel) it stops with the reason and never runs pip."""
    import subprocess

    env, _ = fake_sdk
    calls = tmp_path / "pip_calls"
    pip = tmp_path / "pip"
    pip.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    pip.chmod(0o755)
    script = XPU_OPS.parents[1] / "scripts" / "p800_install.sh"
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                            env={**os.environ, **env, "PIP": str(pip), "PYTHON": sys.executable})
    assert result.returncode != 0
    assert "not compiled with XPU" in result.stderr
    assert not calls.exists()


def test_setup_py_with_clang_path_on_a_cpu_paddle_stops_before_compiling(fake_sdk, tmp_path):
    """The vendor branch is wired into setup.py's build: with CLANG_PATH set but a CPU paddle the build stops with
    the reason (build isolation or a missing paddlepaddle-xpu) before any compiler runs."""
    import subprocess

    env, log = fake_sdk
    root = XPU_OPS.parents[1]
    result = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
                             "--build-temp", str(tmp_path / "tmp")], cwd=root, capture_output=True, text=True,
                            timeout=300, env={**os.environ, **env})
    assert result.returncode != 0
    assert "not compiled with XPU" in result.stderr and "p800_install.sh" in result.stderr
    assert not log.exists() and not (tmp_path / "lib").exists()
