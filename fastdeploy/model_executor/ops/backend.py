"""Which backend the state ops run on: a ContextVar set with `use_backend` (docs/design.md §1).

The chosen backend becomes the trailing `ncluster` attribute of every registered op: 0 runs the C++ CPU path,
n >= 1 the Kunlun3 kernel with n clusters (on the host emulator for CPU tensors, on the device for XPU tensors).
"""

import contextlib
import contextvars

import numpy as np
import paddle

from fastdeploy.config import OPS_BACKENDS


_MAX_CLUSTERS = 255  # logical clusters of one Kunlun3 launch (XPU3_KERNEL_MODEL §1.2)

# (backend name, ncluster attribute passed to the ops)
_backend = contextvars.ContextVar("fastdeploy_ops_backend", default=("cpu", 0))


def use_backend(name, ncluster=12):
    """Context manager: runs the ops of the enclosed block on `name`, "cpu" (the C++ CPU path) or "xpu3-emulator"
    (the Kunlun3 kernels on the host emulator, launched with `ncluster` clusters where the launch layout uses it).
    Invalid arguments raise ValueError at the call. "xpu3" is the Kunlun device: the ops receive XPU-place tensors
    and launch their kernels there with `ncluster` clusters (12 = every cluster of a P800; docs/kunlun3.md
    "XPU tensors")."""
    if name not in OPS_BACKENDS:
        raise ValueError(f"use_backend: unknown backend {name!r}; expected one of {', '.join(OPS_BACKENDS)}")
    if name == "cpu":
        return _selected(name, 0)
    if name == "xpu3" and not paddle.is_compiled_with_xpu():
        # Host tensors with ncluster >= 1 would silently run the emulator instead of the device.
        raise ValueError("use_backend: backend 'xpu3' needs paddlepaddle-xpu and a Kunlun device (this paddle is "
                         "not compiled with XPU); use 'xpu3-emulator' for the emulated kernels")
    is_int = isinstance(ncluster, (int, np.integer)) and not isinstance(ncluster, (bool, np.bool_))
    if not is_int or not 1 <= ncluster <= _MAX_CLUSTERS:
        raise ValueError(f"use_backend: ncluster must be an int in [1, {_MAX_CLUSTERS}] (got {ncluster!r})")
    return _selected(name, int(ncluster))


@contextlib.contextmanager
def _selected(name, ncluster):
    token = _backend.set((name, ncluster))
    try:
        yield
    finally:
        _backend.reset(token)


def current_backend():
    """Name of the backend the ops run on in this context."""
    return _backend.get()[0]




def current_ncluster():
    """The `ncluster` attribute the ops of this context pass (0: the CPU path)."""
    return _backend.get()[1]
