"""Runs one `OpCase` through the Python entry points (`fastdeploy.model_executor.ops.state_ops`) on a chosen backend and
compares every argument tensor with the expected state (OPS §2.1: every argument, modified or not, bit-identical).
"""

import numpy as np
import paddle

from reference.inputs import OpCase

EMULATOR = "xpu3-emulator"


def ops_module():
    """The Python entry module, imported on first use so that reference-only tests collect without the build."""
    from fastdeploy.model_executor.ops import state_ops as ops
    return ops


def backend_context(backend: tuple[str, int]):
    """`with` context that selects the backend ("cpu", 0) or (EMULATOR, ncluster) (docs/design.md §1)."""
    name, ncluster = backend
    ops = ops_module()
    return ops.use_backend(name) if name == "cpu" else ops.use_backend(name, ncluster=ncluster)


def to_paddle(a: np.ndarray | None):
    return None if a is None else paddle.to_tensor(a, place=paddle.CPUPlace())


def call_op(op: str, backend, args: list, attrs: dict | list):
    """Calls the Python entry of `op` with positional tensors then attributes, inside the backend context."""
    fn = getattr(ops_module(), op)
    attr_values = list(attrs.values()) if isinstance(attrs, dict) else list(attrs)
    with backend_context(backend):
        return fn(*args, *attr_values)


def run_op(case: OpCase, backend):
    """Returns (tensors after the call as NumPy arrays, result as NumPy or None). The case is not modified."""
    tensors = {k: to_paddle(v) for k, v in case.tensors.items()}
    result = call_op(case.op, backend, list(tensors.values()), case.attrs)
    after = {k: None if t is None else t.numpy() for k, t in tensors.items()}
    if result is not None and not isinstance(result, np.ndarray):
        result = result.numpy()
    return after, result


def assert_states_equal(actual: dict, expected: dict, context: str) -> None:
    """Exact equality per named tensor: dtype, shape and every element."""
    assert actual.keys() == expected.keys(), context
    for name, exp in expected.items():
        act = actual[name]
        if exp is None:
            assert act is None, f"{context}: '{name}' expected None"
            continue
        assert act.dtype == exp.dtype, f"{context}: '{name}' dtype {act.dtype} != {exp.dtype}"
        assert act.shape == exp.shape, f"{context}: '{name}' shape {act.shape} != {exp.shape}"
        np.testing.assert_array_equal(act, exp, err_msg=f"{context}: tensor '{name}'")


def assert_results_equal(actual, expected, context: str) -> None:
    if expected is None:
        assert actual is None, f"{context}: expected no result"
        return
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
        f"{context}: result {actual.dtype}{list(actual.shape)} != {expected.dtype}{list(expected.shape)}")
    np.testing.assert_array_equal(actual, expected, err_msg=f"{context}: result")
