"""Build of the native ops: the Kunlun3 plugin (wrappers, op layer, emulated kernels, emulator runtime) compiled
once and linked into two extension modules (docs/design.md §2):

* ``fastdeploy.model_executor.ops._paddle_ops`` -- the Paddle custom ops (loaded with
  ``paddle.utils.cpp_extension.load_op_meta_info_and_register_op``, not imported as a Python module);
* ``fastdeploy.model_executor.ops._kl3_pybind`` -- the same ops over NumPy arrays, without Paddle;
* ``fastdeploy.model_executor.ops._cpu_linear`` -- the reduced-precision CPU linear ops (OPS §10): the project's
  own AVX512_BF16 kernel and the oneDNN that Paddle's wheel ships (``paddle/libs/libdnnl.so.3``), compiled with the headers of the matching oneDNN
  release (the ``onednn-devel`` wheel, fetched at build time without its dependencies; Paddle's own copy of the
  headers is incomplete). Not part of the vendor build: on Kunlun the linears are Paddle's own kernels.

Each ``.xpu`` kernel is compiled for the host through a generated translation unit that includes the emulator
header and then the kernel source (XPU3_KERNEL_MODEL §12.1). At most two compiler processes run at a time.

Vendor build (docs/kunlun3.md, "Building"): where ``paddle.is_compiled_with_xpu()`` and ``CLANG_PATH`` plus the
XDNN/XRE locations are given, the kernels are compiled with XTDK clang (XPU3_KERNEL_MODEL §10), the wrappers with
XTDK clang in host-only mode, the op layer and the Paddle ops with ``PADDLE_WITH_XPU`` and the vendor switches,
and both extensions link ``-lxpuapi -lxpurt``; the emulator is left out. Sources and flags come from
``custom_ops/xpu_ops/build_manifest.txt`` (read by CMakeLists.txt too) through ``kl3_build``.
"""

import hashlib
import os
import sys
import sysconfig
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
XPU_OPS = ROOT / "custom_ops" / "xpu_ops"
OPS = XPU_OPS / "src" / "ops"
sys.path.insert(0, str(XPU_OPS))
import kl3_build  # noqa: E402  (custom_ops/xpu_ops/kl3_build.py: the shared build manifest)

MAX_JOBS = 2
# -fwrapv: signed overflow wraps (as on the device), so out-of-domain values cannot turn an index guard into
# undefined behaviour (OPS §2.4: memory safety for any contents).
CXX_FLAGS = ["-std=c++17", "-O2", "-fPIC", "-fwrapv", "-pthread", "-Wall", "-D_GLIBCXX_USE_CXX11_ABI=1"]
PLUGIN_INCLUDES = kl3_build.include_dirs()


def _rel(path):
    return str(Path(path).relative_to(ROOT))


def _sorted_glob(base, pattern):
    return sorted(base.glob(pattern)) if base.is_dir() else []


def _kernel_sources():
    return kl3_build.sources("KERNEL_DIRS")


def _plugin_sources(vendor):
    """Host C++ sources of the plugin shared by both extensions (kernels are added separately); the vendor build
    has no emulator and compiles the wrappers with XTDK clang."""
    if vendor:
        return kl3_build.sources("OP_COMMON_DIRS")
    return kl3_build.sources("WRAPPER_DIRS") + kl3_build.sources("OP_COMMON_DIRS") + kl3_build.sources("EMULATOR_DIRS")


def _plugin_defines(vendor):
    # KL3_WITH_KERNELS: the Kunlun3 kernels are part of the build (same macro as CMakeLists.txt).
    if vendor:
        return kl3_build.manifest()["VENDOR_DEFINES"]
    return ["-DKL3_WITH_KERNELS"] if _kernel_sources() else []


# Kernel translation units: the host emulation of the Kunlun3 dialect (XPU3_KERNEL_MODEL §12.1); g++ ignores the
# kernels' `__attribute__((global))`.
KERNEL_TU_FLAGS = ["-DKL3_EMULATION", "-Wno-attributes"]


def _up_to_date(obj: Path, dep_file: Path) -> bool:
    """True if `obj` exists and is newer than every file in its g++ dependency file (source + project headers)."""
    if not obj.exists() or not dep_file.exists():
        return False
    deps = dep_file.read_text().replace("\\\n", " ").split(":", 1)[-1].split()
    obj_time = obj.stat().st_mtime
    return all(Path(d).exists() and Path(d).stat().st_mtime <= obj_time for d in deps)


def _unity_source(ext, out: Path) -> Path:
    """One translation unit including every source of `ext`, written under `out` (rewritten only when its text
    changes). Each of these sources includes Paddle's extension header, whose parse alone costs ~7 s of the ~8 s a
    source takes to compile here: one unit parses it once (the 8 state ops build in 9 s, not 64). The sources must
    not share a file-local name (a clash fails this build)."""
    tu = out / "unity.cc"
    text = "".join(f'#include "{ROOT / src}"\n' for src in ext.sources)
    if not tu.exists() or tu.read_text() != text:
        tu.parent.mkdir(parents=True, exist_ok=True)
        tu.write_text(text)
    return tu


class BuildNativeOps(build_ext):
    """Compiles the plugin objects once, then links them into every extension.

    Objects live in build/native-<python>/<hash of the compile flags>/ whatever build_temp setuptools picks (an
    editable install uses a fresh temporary directory each time), so rebuilds only recompile sources whose own
    text or project headers changed (g++ -MMD dependency files). Objects and dependency files are written under
    temporary names and renamed, so concurrent builds never link a half-written object.
    """

    def finalize_options(self):
        super().finalize_options()
        self._plugin_objects = None
        self.vendor = kl3_build.vendor_toolchain()
        self._object_root = ROOT / "build" / f"native-{sys.implementation.cache_tag}"

    def _object_dir(self, flags):
        digest = hashlib.sha256("\0".join(self.compiler.compiler_so + flags).encode()).hexdigest()[:12]
        return self._object_root / digest

    def _compile(self, source, obj, flags):
        obj = Path(obj)
        dep_file = obj.with_name(obj.name + ".d")
        if not self.force and _up_to_date(obj, dep_file):
            return str(obj)
        obj.parent.mkdir(parents=True, exist_ok=True)
        tmp = f".{os.getpid()}.{threading.get_ident()}.tmp"
        obj_tmp, dep_tmp = obj.with_name(obj.name + tmp), dep_file.with_name(dep_file.name + tmp)
        self.compiler.spawn(
            self.compiler.compiler_so + [str(ROOT / source), "-c", "-o", str(obj_tmp), "-MMD", "-MF", str(dep_tmp)] + flags
        )
        os.replace(obj_tmp, obj)
        os.replace(dep_tmp, dep_file)
        return str(obj)

    def _compile_all(self, jobs):
        """jobs: list of (source, object path, flags); compiled in the build's pool (MAX_JOBS at a time)."""
        return [future.result() for future in [self._pool.submit(self._compile, *job) for job in jobs]]

    def _build_vendor_objects(self, out):
        """Kernels and wrappers compiled by XTDK clang (XPU3_KERNEL_MODEL §10); the command lines are kl3_build's."""
        objects = []
        kernel_dir, wrapper_dir = out / "xpu3", out / "xpu3_wrappers"
        kernel_dir.mkdir(parents=True, exist_ok=True)
        wrapper_dir.mkdir(parents=True, exist_ok=True)
        for kernel in _kernel_sources():
            command, outputs = kl3_build.kernel_command(self.vendor, kernel, kernel_dir)
            self.compiler.spawn(command)
            objects += [str(o) for o in outputs]
        for wrapper in kl3_build.sources("WRAPPER_DIRS"):
            obj = wrapper_dir / (_rel(wrapper).replace("/", "__") + ".o")
            self.compiler.spawn(kl3_build.wrapper_command(self.vendor, wrapper, obj))
            objects.append(str(obj))
        return objects

    def _build_plugin(self):
        if self._plugin_objects is not None:
            return self._plugin_objects
        vendor = self.vendor is not None
        flags = CXX_FLAGS + _plugin_defines(vendor) + [f"-I{p}" for p in PLUGIN_INCLUDES]
        if vendor:
            flags += self.vendor.include_flags()
        out = self._object_dir(flags) / "kl3_plugin"
        jobs = [(src, out / (_rel(src) + ".o"), flags) for src in _plugin_sources(vendor)]
        if vendor:
            self._plugin_objects = self._compile_all(jobs) + self._build_vendor_objects(out)
            return self._plugin_objects
        gen_dir = out / "kernel_tu"
        gen_dir.mkdir(parents=True, exist_ok=True)
        for kernel in _kernel_sources():
            # One generated translation unit per kernel: emulator header first, then the unmodified source.
            tu = gen_dir / (_rel(kernel).replace("/", "__") + ".cpp")
            text = f'#include "kl3_emu.h"\n#include "{kernel}"\n'
            if not tu.exists() or tu.read_text() != text:
                tu.write_text(text)
            jobs.append((tu, out / (_rel(kernel) + ".o"), flags + KERNEL_TU_FLAGS))
        self._plugin_objects = self._compile_all(jobs)
        return self._plugin_objects

    def _queue_own_objects(self, ext):
        """Queues the compile of `ext`'s own sources (one unit, _unity_source) in the build's pool: futures."""
        flags = CXX_FLAGS + list(ext.extra_compile_args) + [f"-I{p}" for p in PLUGIN_INCLUDES]
        out = self._object_dir(flags) / ext.name.replace(".", "/")
        sources = [_unity_source(ext, out)] if len(ext.sources) > 1 else ext.sources
        return [self._pool.submit(self._compile, src, out / (Path(src).name + ".o"), flags) for src in sources]

    def build_extension(self, ext):
        plugin_objects = self._build_plugin() if ext.name in PLUGIN_EXTENSIONS else []
        objects = [future.result() for future in self._own_objects[ext.name]] + plugin_objects
        ext_path = Path(self.get_ext_fullpath(ext.name))
        if not self.force and ext_path.exists():
            if ext_path.stat().st_mtime >= max(Path(o).stat().st_mtime for o in objects):
                return
        ext_path.parent.mkdir(parents=True, exist_ok=True)
        # Link under a temporary name, then rename: a process loading the old library never sees a partial file.
        tmp_path = ext_path.with_name(f".{ext_path.name}.{os.getpid()}.tmp")
        self.compiler.link_shared_object(
            objects,
            str(tmp_path),
            library_dirs=ext.library_dirs,
            extra_postargs=list(ext.extra_link_args),
            target_lang="c++",
        )
        os.replace(tmp_path, ext_path)

    def build_extensions(self):
        _check_op_signatures()
        # Compile with the C++ driver and only the project's flags (Python's own -g -O3 flags would slow the
        # build and bloat the objects).
        cxx = os.environ.get("CXX", sysconfig.get_config_var("CXX") or "g++").split()
        self.compiler.compiler_so = cxx
        self.compiler.linker_so = cxx + ["-shared", "-pthread"]  # the emulator runs cores as threads
        if self.vendor is not None:
            self.extensions = [ext for ext in self.extensions if ext.name in PLUGIN_EXTENSIONS]
        for ext in self.extensions:
            ext.extra_compile_args, ext.library_dirs, ext.extra_link_args = _toolchain_args(ext.name, self.vendor)
        with ThreadPoolExecutor(max_workers=MAX_JOBS) as self._pool:
            # every extension's unit queued first: each is one long compile, and queued by its own extension they
            # would run one after another
            self._own_objects = {ext.name: self._queue_own_objects(ext) for ext in self.extensions}
            for ext in self.extensions:
                self.build_extension(ext)


def _check_op_signatures():
    """docs/design.md §1: every face of every op must match fastdeploy/model_executor/ops/op_table.py before anything
    is compiled (custom_ops/xpu_ops/tools/check_op_signatures.py)."""
    import importlib.util

    from setuptools.errors import SetupError

    path = XPU_OPS / "tools" / "check_op_signatures.py"
    spec = importlib.util.spec_from_file_location("check_op_signatures", path)
    checker = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = checker
    spec.loader.exec_module(checker)
    problems = checker.check()
    if problems:
        raise SetupError("op signatures drift from op_table.py:\n  " + "\n  ".join(problems))


def _toolchain_args(name, vendor=None):
    """(compile args, library dirs, link args) of an extension; imports Paddle/pybind11 only when building. With
    the vendor toolchain `vendor`, both extensions take the vendor switches and link the Kunlun runtime."""
    compile_args, library_dirs, link_args = _host_toolchain_args(name)
    if vendor is None:
        return compile_args, library_dirs, link_args
    manifest = kl3_build.manifest()
    defines = manifest["VENDOR_DEFINES"] + (manifest["PADDLE_XPU_DEFINES"] if name.endswith("_paddle_ops") else [])
    return (defines + vendor.include_flags() + compile_args, library_dirs + vendor.library_dirs(),
            link_args + kl3_build.vendor_link_args(vendor))


ONEDNN_HEADERS = "onednn-devel==2025.0.1"   # oneDNN 3.6.1's headers, for the 3.6.2 library inside Paddle's wheel


def _onednn_include_dir():
    """oneDNN's headers for _cpu_linear: $ONEDNN_INCLUDE_DIR, else the onednn-devel wheel's include/ unpacked under
    build/. The wheel is fetched by `pip download --no-deps` (204 KB): installed as a dependency it would bring the
    `onednn` runtime package and its ~2 GB of Intel runtimes, a second libdnnl.so.3 the process must never load."""
    import shutil
    import subprocess
    import tempfile
    import zipfile

    from setuptools.errors import SetupError

    given = os.environ.get("ONEDNN_INCLUDE_DIR")
    if given:
        if not (Path(given) / "oneapi" / "dnnl" / "dnnl.hpp").is_file():
            raise SetupError(f"ONEDNN_INCLUDE_DIR={given} has no oneapi/dnnl/dnnl.hpp")
        return given
    include = ROOT / "build" / ONEDNN_HEADERS.replace("==", "-") / "include"
    if (include / "oneapi" / "dnnl" / "dnnl.hpp").is_file():
        return str(include)
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--quiet", "-d", tmp, ONEDNN_HEADERS], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise SetupError(f"could not download {ONEDNN_HEADERS} (oneDNN's headers for the CPU linear ops): "
                             f"{done.stderr.strip()[-500:]}; or set ONEDNN_INCLUDE_DIR to a oneDNN 3.6 include "
                             f"directory")
        staging = include.with_name(f"include.{os.getpid()}.tmp")
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member in wheel.namelist():
                head, sep, rest = member.partition(".data/data/include/")
                if sep and rest and not member.endswith("/"):
                    target = staging / rest
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(wheel.read(member))
        if include.exists():   # a concurrent build got there first
            shutil.rmtree(staging)
        else:
            os.replace(staging, include)
    return str(include)


def _host_toolchain_args(name):
    if name.endswith(("_paddle_ops", "_cpu_linear")):
        from paddle.utils.cpp_extension.extension_utils import find_paddle_includes, find_paddle_libraries

        # paddle/extension.h includes pybind11, hence Python.h.
        includes = find_paddle_includes() + [sysconfig.get_paths()["include"]]
        compile_args = ["-DPADDLE_WITH_CUSTOM_KERNEL"] + [f"-isystem{p}" for p in includes]
        link_args = ["-Wl,--no-as-needed", "-l:libpaddle.so", "-Wl,--as-needed"]
        if name.endswith("_cpu_linear"):
            # oneDNN's headers first: Paddle's include tree carries an incomplete copy of them
            # OpenMP: the own kernel splits its column blocks over threads (GNU's runtime; Paddle's kernels and its
            # oneDNN run on Intel's libiomp5: fastdeploy/__init__.py says what that asks for)
            # -ffp-contract=off: arithmetic as written, no FMA fusing a product and a sum (the rotation must equal
            # Paddle's separate elementwise ops bit for bit; the kernels ask for their FMAs by intrinsic)
            compile_args = [f"-isystem{_onednn_include_dir()}", "-fopenmp", "-ffp-contract=off"] + compile_args
            # Paddle's own oneDNN, already loaded; glibc's vector math library (the decode attention's expf)
            link_args = link_args + ["-l:libdnnl.so.3", "-fopenmp", "-lmvec"]
        return compile_args, find_paddle_libraries(), link_args
    import pybind11

    compile_args = [f"-isystem{pybind11.get_include()}", f"-isystem{sysconfig.get_paths()['include']}",
                    "-fvisibility=hidden"]
    return compile_args, [], []


# The extensions that link the Kunlun3 plugin (the state ops); _cpu_linear does not.
PLUGIN_EXTENSIONS = ("fastdeploy.model_executor.ops._paddle_ops", "fastdeploy.model_executor.ops._kl3_pybind")

EXTENSIONS = [
    Extension(
        "fastdeploy.model_executor.ops._paddle_ops",
        sources=[_rel(p) for p in _sorted_glob(OPS / "mtp", "*.cc")],
    ),
    Extension(
        "fastdeploy.model_executor.ops._kl3_pybind",
        sources=[_rel(OPS / "pybind" / "pybind.cc")],
    ),
    Extension(
        "fastdeploy.model_executor.ops._cpu_linear",
        sources=[_rel(ROOT / "custom_ops" / "cpu_ops" / name)
                 for name in ("cpu_linear.cc", "dpbf16_linear.cc", "decode_attention.cc", "prefill_attention.cc",
                              "rope_cache_write.cc", "rms_norm.cc", "swiglu_mlp.cc", "attention_block.cc",
                              "decoder_stack.cc", "moe_route.cc",
                              # last: the Python module calls the op functions the sources above define
                              "python_calls.cc")],
    ),
]

# Tests load this file under the name "fd_setup" to exercise the build logic (the vendor branch with a fake
# toolchain) without building; every other way of running it (pip's build backend, `python setup.py ...`) builds.
if __name__ != "fd_setup":
    setup(ext_modules=EXTENSIONS, cmdclass={"build_ext": BuildNativeOps})
