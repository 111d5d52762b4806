"""Build of the native ops: the Kunlun3 plugin (wrappers, op layer, emulated kernels, emulator runtime) compiled
once and linked into two extension modules (docs/design.md §2):

* ``fastdeploy.model_executor.ops._paddle_ops`` -- the Paddle custom ops (loaded with
  ``paddle.utils.cpp_extension.load_op_meta_info_and_register_op``, not imported as a Python module);
* ``fastdeploy.model_executor.ops._kl3_pybind`` -- the same ops over NumPy arrays, without Paddle.

Each ``.xpu`` kernel is compiled for the host through a generated translation unit that includes the emulator
header and then the kernel source (XPU3_KERNEL_MODEL §12.1). At most two compiler processes run at a time.
"""

import os
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
XPU_OPS = ROOT / "custom_ops" / "xpu_ops"
PLUGIN = XPU_OPS / "src" / "plugin"
OPS = XPU_OPS / "src" / "ops"
EMULATOR = XPU_OPS / "emulator"

MAX_JOBS = 2
CXX_FLAGS = ["-std=c++17", "-O2", "-fPIC", "-Wall", "-D_GLIBCXX_USE_CXX11_ABI=1"]
PLUGIN_INCLUDES = [PLUGIN / "include", PLUGIN / "src", PLUGIN / "src" / "kernel" / "include", OPS, EMULATOR / "include"]


def _rel(path):
    return str(Path(path).relative_to(ROOT))


def _sorted_glob(base, pattern):
    return sorted(base.glob(pattern)) if base.is_dir() else []


def _kernel_sources():
    return _sorted_glob(PLUGIN / "src" / "kernel" / "kunlun3cpp", "**/*.xpu")


def _plugin_sources():
    """Host C++ sources of the plugin shared by both extensions (kernels are added separately)."""
    return (
        _sorted_glob(PLUGIN / "src" / "wrapper", "**/*.cpp")
        + _sorted_glob(OPS / "common", "*.cc")
        + _sorted_glob(EMULATOR / "src", "*.cpp")
    )


def _plugin_defines():
    # Host builds always run Kunlun3 kernels on the emulator; KL3_WITH_KERNELS tells the wrappers that the
    # kernels are part of the build. g++ ignores the kernels' `__attribute__((global))` (XPU3_KERNEL_MODEL §12.1).
    defines = ["-DKL3_EMULATION", "-Wno-attributes"]
    if _kernel_sources():
        defines.append("-DKL3_WITH_KERNELS")
    return defines


def _newest_header_mtime():
    headers = [p for base in (XPU_OPS,) for ext in ("h", "hpp", "xpu") for p in base.rglob(f"*.{ext}")]
    return max((p.stat().st_mtime for p in headers), default=0.0)


class BuildNativeOps(build_ext):
    """Compiles the plugin objects once, then links them into every extension."""

    def finalize_options(self):
        super().finalize_options()
        self._plugin_objects = None

    def _compile_all(self, jobs):
        """jobs: list of (source, object path, extra args); compiled at most MAX_JOBS at a time."""
        with ThreadPoolExecutor(max_workers=MAX_JOBS) as pool:
            return list(pool.map(lambda job: self._compile_with_object(*job), jobs))

    def _compile_with_object(self, source, obj, extra_args):
        obj = Path(obj)
        if not self.force and obj.exists():
            obj_time = obj.stat().st_mtime
            if obj_time >= Path(source).stat().st_mtime and obj_time >= self._header_time:
                return str(obj)
        obj.parent.mkdir(parents=True, exist_ok=True)
        self.compiler.spawn(self.compiler.compiler_so + [str(source), "-c", "-o", str(obj)] + extra_args)
        return str(obj)

    def _build_plugin(self):
        if self._plugin_objects is not None:
            return self._plugin_objects
        self._header_time = _newest_header_mtime()
        out = Path(self.build_temp) / "kl3_plugin"
        includes = [f"-I{p}" for p in PLUGIN_INCLUDES]
        flags = CXX_FLAGS + _plugin_defines() + includes
        jobs = [(src, out / (_rel(src) + ".o"), flags) for src in _plugin_sources()]
        gen_dir = out / "kernel_tu"
        gen_dir.mkdir(parents=True, exist_ok=True)
        for kernel in _kernel_sources():
            # One generated translation unit per kernel: emulator header first, then the unmodified source.
            tu = gen_dir / (_rel(kernel).replace("/", "__") + ".cpp")
            text = f'#include "kl3_emu.h"\n#include "{kernel}"\n'
            if not tu.exists() or tu.read_text() != text:
                tu.write_text(text)
            jobs.append((tu, out / (_rel(kernel) + ".o"), flags))
        self._plugin_objects = self._compile_all(jobs)
        return self._plugin_objects

    def build_extension(self, ext):
        plugin_objects = self._build_plugin()
        out = Path(self.build_temp) / ext.name.replace(".", "/")
        flags = CXX_FLAGS + list(ext.extra_compile_args) + [f"-I{p}" for p in PLUGIN_INCLUDES]
        jobs = [(src, out / (Path(src).name + ".o"), flags) for src in ext.sources]
        ext_objects = self._compile_all(jobs)
        ext_path = Path(self.get_ext_fullpath(ext.name))
        ext_path.parent.mkdir(parents=True, exist_ok=True)
        objects = ext_objects + plugin_objects
        if not self.force and ext_path.exists():
            newest = max(Path(o).stat().st_mtime for o in objects)
            if ext_path.stat().st_mtime >= newest:
                return
        self.compiler.link_shared_object(
            objects,
            str(ext_path),
            library_dirs=ext.library_dirs,
            extra_postargs=list(ext.extra_link_args),
            target_lang="c++",
        )

    def build_extensions(self):
        # Compile with the C++ driver and only the project's flags (Python's own -g -O3 flags would slow the
        # build and bloat the objects).
        cxx = os.environ.get("CXX", sysconfig.get_config_var("CXX") or "g++").split()
        self.compiler.compiler_so = cxx
        self.compiler.linker_so = cxx + ["-shared"]
        for ext in self.extensions:
            ext.extra_compile_args, ext.library_dirs, ext.extra_link_args = _toolchain_args(ext.name)
            self.build_extension(ext)


def _toolchain_args(name):
    """(compile args, library dirs, link args) of an extension; imports Paddle/pybind11 only when building."""
    if name.endswith("_paddle_ops"):
        from paddle.utils.cpp_extension.extension_utils import find_paddle_includes, find_paddle_libraries

        # paddle/extension.h includes pybind11, hence Python.h.
        includes = find_paddle_includes() + [sysconfig.get_paths()["include"]]
        compile_args = ["-DPADDLE_WITH_CUSTOM_KERNEL"] + [f"-isystem{p}" for p in includes]
        link_args = ["-Wl,--no-as-needed", "-l:libpaddle.so", "-Wl,--as-needed"]
        return compile_args, find_paddle_libraries(), link_args
    import pybind11

    compile_args = [f"-isystem{pybind11.get_include()}", f"-isystem{sysconfig.get_paths()['include']}",
                    "-fvisibility=hidden"]
    return compile_args, [], []


setup(
    ext_modules=[
        Extension(
            "fastdeploy.model_executor.ops._paddle_ops",
            sources=[_rel(p) for p in _sorted_glob(OPS / "mtp", "*.cc")],
        ),
        Extension(
            "fastdeploy.model_executor.ops._kl3_pybind",
            sources=[_rel(OPS / "pybind" / "pybind.cc")],
        ),
    ],
    cmdclass={"build_ext": BuildNativeOps},
)
