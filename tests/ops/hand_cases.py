"""Hand-built cases (OPS §8 C2): a named input state plus the expected values, written by hand from OPS.md.

A case lists only the tensors the op changes; every other argument tensor must come back unchanged. Each case is
checked against the NumPy reference and against the op on the backend under test.
"""

from dataclasses import dataclass, field

import numpy as np

from reference.inputs import OpCase, run_reference

from .harness import assert_results_equal, assert_states_equal, run_op


@dataclass
class HandCase:
    name: str
    case: OpCase
    changes: dict[str, object] = field(default_factory=dict)  # tensor name -> expected value after the call
    result: object = None  # expected returned message (speculate_save_output)

    def expected(self) -> dict[str, np.ndarray]:
        state = {k: None if v is None else v.copy() for k, v in self.case.tensors.items()}
        for name, value in self.changes.items():
            base = state[name]
            state[name] = np.asarray(value, dtype=base.dtype).reshape(base.shape)
        return state


def i32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def flags(values) -> np.ndarray:
    return np.asarray(values, dtype=np.bool_)


def check_hand_case(hc: HandCase, backend) -> None:
    """The reference and the op both produce exactly the hand-written state (and message)."""
    expected = hc.expected()
    expected_result = None if hc.result is None else np.asarray(hc.result, dtype=np.int64)
    for who, (state, result) in (("reference", run_reference(hc.case)), (f"op on {backend}", run_op(hc.case, backend))):
        context = f"{hc.case.op} case '{hc.name}' ({who})"
        assert_states_equal(state, expected, context)
        assert_results_equal(result, expected_result, context)
