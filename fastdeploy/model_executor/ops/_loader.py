"""Registers each Paddle op library (`_paddle_ops`: the state ops; `_cpu_linear`: the CPU linear ops) exactly once
per process (registering an op name twice aborts the process), and gives each library as a Python module."""

import importlib
import importlib.machinery
import threading
from pathlib import Path

_lock = threading.Lock()
_loaded: set[str] = set()


def library_path(name: str = "_paddle_ops") -> Path:
    """Path of the built extension `name` next to this file."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"{name}{suffix}"
        if candidate.exists():
            return candidate
    raise ImportError(
        f"fastdeploy.model_executor.ops: the native op library {name} was not found in {here}; "
        "build it with `pip install -e .` (or `python setup.py build_ext --inplace`)"
    )


def ensure_loaded(name: str = "_paddle_ops") -> None:
    """Registers the ops of library `name` with Paddle on the first call; later calls return at once."""
    if name in _loaded:
        return
    with _lock:
        if name in _loaded:
            return
        from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op

        load_op_meta_info_and_register_op(str(library_path(name)))
        _loaded.add(name)


_modules: dict = {}


def python_module(name: str = "_paddle_ops"):
    """Library `name` as a Python module, its ops registered with Paddle too. Its functions run the ops' kernels
    under the registered names, without the per-call cost of Paddle's custom-op entry, which copies every
    registered op's metadata on each call (custom_ops/cpu_ops/python_calls.cc)."""
    module = _modules.get(name)
    if module is None:
        ensure_loaded(name)
        module = _modules[name] = importlib.import_module(f"{__package__}.{name}")
    return module


def cpu_ops():
    """`_cpu_linear` as a Python module: the CPU ops the layers call (OPS §10-§12)."""
    return python_module("_cpu_linear")
