"""The benchmark's dispatch floors (`fd_dispatch_floor`, `fd_dispatch_floor_<op>`) really do nothing: they are
registered with each op's exact signature and in-place map, so every argument tensor must come back unchanged.
Otherwise benchmarks/ops_latency.py would compare the ops against something that does work."""

import numpy as np
import pytest

from reference.inputs import GENERATORS, gen_inputs

from .harness import ops_module, to_paddle


@pytest.mark.parametrize("op", sorted(GENERATORS))
def test_same_signature_floor_leaves_every_argument_unchanged(op):
    ops = ops_module()
    case = gen_inputs(op, seed=11, B=16, R=12, T=3)
    tensors = {k: to_paddle(v) for k, v in case.tensors.items()}
    attrs = list(case.attrs.values()) if isinstance(case.attrs, dict) else list(case.attrs)
    ops.fd_dispatch_floor_as(op, *tensors.values(), *attrs)
    for name, before in case.tensors.items():
        if before is not None:
            np.testing.assert_array_equal(tensors[name].numpy(), before, err_msg=f"{op}: {name}")


def test_one_tensor_floor_leaves_its_tensor_unchanged():
    x = to_paddle(np.arange(8, dtype=np.int32))
    ops_module().fd_dispatch_floor(x)
    np.testing.assert_array_equal(x.numpy(), np.arange(8, dtype=np.int32))
