"""C1 parity (OPS §8 C1, PD_MTP_FLOW I8): on seeded random in-domain states, the op leaves every argument tensor
bit-identical to the NumPy reference and returns the same message."""

import numpy as np
import pytest

from reference.inputs import GENERATORS, gen_inputs, run_reference

from .case_counts import CPU_PARITY_CASES, EMULATOR_PARITY_CASES
from .harness import assert_results_equal, assert_states_equal, run_op

MAX_B = 512


def draw_dims(rng) -> tuple[int, int, int]:
    """(B, R, T): mostly small batches, some up to the 512-slot maximum; R <= B; T in 1..8."""
    u = rng.random()
    B = int(rng.integers(1, 17) if u < 0.7 else rng.integers(17, 129) if u < 0.9 else rng.integers(129, MAX_B + 1))
    R = B if rng.random() < 0.4 else int(rng.integers(1, B + 1))
    return B, R, int(rng.integers(1, 9))


@pytest.mark.parametrize("op", list(GENERATORS))
def test_op_matches_reference_on_random_states(op, backend):
    """OPS §2.1 / §8 C1: every argument tensor and the result equal the reference's, for every seed."""
    cases = CPU_PARITY_CASES if backend[0] == "cpu" else EMULATOR_PARITY_CASES
    dims_rng = np.random.default_rng(1234)
    for seed in range(cases):
        B, R, T = draw_dims(dims_rng)
        case = gen_inputs(op, seed, B, R, T)
        context = f"{op} on {backend}, seed={seed}, B={B}, R={R}, T={T}"
        expected, expected_result = run_reference(case)
        actual, actual_result = run_op(case, backend)
        assert_states_equal(actual, expected, context)
        assert_results_equal(actual_result, expected_result, context)
