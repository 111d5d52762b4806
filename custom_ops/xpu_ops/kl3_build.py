"""Turns build_manifest.txt into the source lists and compiler command lines of every native build (setup.py's
host and vendor builds, the XPU compile check; CMakeLists.txt reads the same manifest), so that they share one
list of sources and flags.

The vendor build (XPU3_KERNEL_MODEL §10) is chosen by `vendor_toolchain()`: Paddle compiled with XPU plus the
locations of XTDK clang and the XDNN/XRE SDK in the environment (docs/kunlun3.md, "Building").
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

XPU_OPS = Path(__file__).resolve().parent
MANIFEST = XPU_OPS / "build_manifest.txt"
SDK_DECLS = XPU_OPS / "xpu_sdk_decls"  # compile-check declarations of the XRE/XDNN names (DECLARATIONS.md)

_SUFFIX = {"KERNEL_DIRS": ".xpu", "WRAPPER_DIRS": ".cpp", "OP_COMMON_DIRS": ".cc", "EMULATOR_DIRS": ".cpp"}


def manifest() -> dict[str, list[str]]:
    """NAME -> words of every `NAME = ...` line."""
    entries = {}
    for line in MANIFEST.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            entries[name.strip()] = shlex.split(value)
    return entries


def sources(key: str) -> list[Path]:
    """Sorted sources of a `*_DIRS` entry (searched recursively for the entry's file extension)."""
    found = []
    for rel in manifest()[key]:
        base = XPU_OPS / rel
        if base.is_dir():
            found += sorted(base.rglob("*" + _SUFFIX[key]))
    return found


def include_dirs() -> list[Path]:
    return [XPU_OPS / rel for rel in manifest()["INCLUDE_DIRS"]]


@dataclass(slots=True)
class VendorToolchain:
    """Where the Kunlun SDK is (XPU3_KERNEL_MODEL §10 environment variables)."""

    clang: Path            # $CLANG_PATH/bin/clang++
    xdnn_include: Path     # $XDNN_INC_DIR or $XPU_INC_DIR
    xdnn_lib: Path         # $XDNN_LIB_DIR or $XPU_LIB_DIR
    xre_include: Path | None
    xre_lib: Path | None
    target_arch: str

    def include_flags(self) -> list[str]:
        dirs = [self.xdnn_include] + ([self.xre_include] if self.xre_include else [])
        return [f"-I{d}" for d in dirs] + [f"-I{d}" for d in include_dirs()]

    def library_dirs(self) -> list[str]:
        return [str(d) for d in (self.xdnn_lib, self.xre_lib) if d]


def vendor_toolchain(env=None, paddle_with_xpu: bool | None = None) -> VendorToolchain | None:
    """The vendor toolchain when Paddle is compiled with XPU and CLANG_PATH is set; None for the host build.

    Raises ValueError naming the variable when the vendor build is requested but a location is missing or wrong.
    `paddle_with_xpu` defaults to `paddle.is_compiled_with_xpu()`."""
    env = os.environ if env is None else env
    if not env.get("CLANG_PATH"):
        return None
    if paddle_with_xpu is None:
        import paddle

        paddle_with_xpu = paddle.is_compiled_with_xpu()
    if not paddle_with_xpu:
        raise ValueError("CLANG_PATH is set (a Kunlun vendor build) but the paddle this build sees is not compiled "
                         "with XPU; install paddlepaddle-xpu and build without isolation (scripts/p800_install.sh), "
                         "or unset CLANG_PATH for the host build")
    clang = Path(env["CLANG_PATH"]) / "bin" / "clang++"
    if not clang.is_file():
        raise ValueError(f"CLANG_PATH: {clang} does not exist (expected the XTDK root that contains bin/clang++)")

    def location(*names: str, required: bool = True) -> Path | None:
        for name in names:
            if env.get(name):
                path = Path(env[name])
                if not path.is_dir():
                    raise ValueError(f"{name}: {path} is not a directory")
                return path
        if required:
            raise ValueError(f"{' or '.join(names)}: not set (needed for the Kunlun vendor build)")
        return None

    entries = manifest()
    return VendorToolchain(clang=clang, xdnn_include=location("XDNN_INC_DIR", "XPU_INC_DIR"),
                           xdnn_lib=location("XDNN_LIB_DIR", "XPU_LIB_DIR"),
                           xre_include=location("XRE_INC_DIR", required=False),
                           xre_lib=location("XRE_LIB_DIR", required=False),
                           target_arch=env.get("TARGET_ARCH") or entries["XTDK_DEFAULT_TARGET_ARCH"][0])


def kernel_command(tc: VendorToolchain, source: Path, out_dir: Path) -> tuple[list[str], list[Path]]:
    """XTDK clang command of one kernel and the objects it writes: `--basename` and `-o` share the stem
    xpu3_<name>, so the host object is xpu3_<name>.o and the device code xpu3_<name>.device.bin.o."""
    stem = out_dir / f"xpu3_{source.stem}"
    command = ([str(tc.clang)] + manifest()["XTDK_KERNEL_FLAGS"] + [f"--target={tc.target_arch}", "--basename",
               str(stem)] + manifest()["VENDOR_DEFINES"] + tc.include_flags() + ["-c", str(source), "-o", f"{stem}.o"])
    return command, [Path(f"{stem}.o"), Path(f"{stem}.device.bin.o")]


def wrapper_command(tc: VendorToolchain, source: Path, obj: Path) -> list[str]:
    """XTDK clang (host only) command of one wrapper: its launches use `<<<...>>>`."""
    return ([str(tc.clang)] + manifest()["XTDK_WRAPPER_FLAGS"] + manifest()["VENDOR_DEFINES"] + tc.include_flags()
            + [str(source), "-o", str(obj)])


def vendor_link_args(tc: VendorToolchain) -> list[str]:
    rpaths = [f"-Wl,-rpath,{d}" for d in tc.library_dirs()]
    return [f"-L{d}" for d in tc.library_dirs()] + [f"-l{lib}" for lib in manifest()["VENDOR_LIBS"]] + rpaths


def compile_check_commands(paddle_includes: list[str], work_dir: Path, cxx: str = "g++",
                           pybind_include: str | None = None) -> list[list[str]]:
    """g++ -fsyntax-only commands of the XPU branch here (docs/kunlun3.md, "Compile check"): the Paddle ops and
    the op layer with PADDLE_WITH_XPU and the vendor switches against the real Paddle headers and the project's
    XRE/XDNN declarations; the wrappers and the probe runner as C++11 with the vendor switches, launches
    type-checked (KL3_COMPILE_CHECK). Compile only: nothing is linked or run. The Paddle ops are checked as one
    generated translation unit in `work_dir` (Paddle's headers dominate the time)."""
    entries = manifest()
    decls = [f"-I{SDK_DECLS}"]
    includes = [f"-I{d}" for d in include_dirs()]
    vendor = entries["VENDOR_DEFINES"] + ["-DKL3_COMPILE_CHECK"]
    paddle = [f"-isystem{p}" for p in paddle_includes]
    commands = []
    paddle_ops = work_dir / "paddle_ops_xpu_check.cc"
    paddle_ops.write_text("".join(f'#include "{p}"\n' for p in sorted((XPU_OPS / "src" / "ops" / "mtp").glob("*.cc"))))
    for source in [paddle_ops] + sources("OP_COMMON_DIRS"):
        commands.append([cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", "-DPADDLE_WITH_CUSTOM_KERNEL"]
                        + entries["PADDLE_XPU_DEFINES"] + vendor + includes + decls + paddle + [str(source)])
    for source in sources("WRAPPER_DIRS"):
        commands.append([cxx, "-std=c++11", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"]
                        + vendor + includes + decls + [str(source)])
    if pybind_include:
        # The pybind module's vendor branch (device queries, probes on the chip); needs pybind11's headers.
        commands.append([cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", f"-isystem{pybind_include}"]
                        + vendor + includes + decls + paddle + [str(XPU_OPS / "src" / "ops" / "pybind" / "pybind.cc")])
    return commands
