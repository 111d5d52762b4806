"""Registers the Paddle op library `_paddle_ops` exactly once per process (registering an op name twice aborts
the process)."""

import importlib.machinery
import threading
from pathlib import Path

_lock = threading.Lock()
_loaded = False


def library_path() -> Path:
    """Path of the built `_paddle_ops` extension next to this file."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"_paddle_ops{suffix}"
        if candidate.exists():
            return candidate
    raise ImportError(
        f"fastdeploy.model_executor.ops: the native op library _paddle_ops was not found in {here}; "
        "build it with `pip install -e .` (or `python setup.py build_ext --inplace`)"
    )


def ensure_loaded() -> None:
    """Registers the ops with Paddle on the first call; later calls return at once."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op

        load_op_meta_info_and_register_op(str(library_path()))
        _loaded = True
