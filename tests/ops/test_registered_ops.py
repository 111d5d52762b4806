"""The state ops as Paddle registers them (`_C_ops._run_custom_op`: FastDeploy's names, what any caller of the
registered op gets) against the same ops through the Python entry, which calls their kernels through
`_paddle_ops`' own Python functions (docs/design.md §1): on the same seeded states, every argument tensor after
the call and the returned message are the same."""

import numpy as np
import paddle
import pytest
from paddle import _C_ops

from fastdeploy.model_executor.ops import op_table, state_ops
from reference.inputs import GENERATORS, gen_inputs


def tensors_of(case) -> list:
    return [None if v is None else paddle.to_tensor(v) for v in case.tensors.values()]


@pytest.mark.parametrize("op", list(GENERATORS))
@pytest.mark.parametrize("seed, b, t", [(0, 1, 1), (1, 8, 2), (2, 256, 3)])
def test_the_registered_op_and_the_entry_agree(op, seed, b, t):
    case, spec = gen_inputs(op, seed, b, b, t), op_table.BY_NAME[op]
    attrs = list(case.attrs.values())
    through_entry, through_paddle = tensors_of(case), tensors_of(case)
    entry_result = getattr(state_ops, op)(*through_entry, *attrs)
    given = [x for x in through_paddle if x is not None]
    registered = next(name for name, args in op_table.registrations(spec).items()
                      if len(args) == len(given))
    paddle_result = _C_ops._run_custom_op(registered, *given, *attrs, 0)
    for name, a, b_ in zip(case.tensors, through_entry, through_paddle):
        if a is not None:
            np.testing.assert_array_equal(a.numpy(), b_.numpy(), err_msg=f"{op}: argument '{name}'")
    if spec.returns_msg:
        np.testing.assert_array_equal(entry_result.numpy(), paddle_result[0].numpy())
    else:
        assert entry_result is None
