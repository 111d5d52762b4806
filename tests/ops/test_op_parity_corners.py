"""C1 parity at the corners of the shape space (OPS §8 C1), driven by hypothesis: B = 1, R = 1, T = 1, single-column
pre_ids / block tables, one-token stop sequences, as well as the largest shapes. Complements the seeded loop of
test_op_parity.py, whose shapes are drawn uniformly. Derandomized, so every run checks the same examples."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference.inputs import gen_inputs, run_reference

from .harness import assert_results_equal, assert_states_equal, run_op

EXAMPLES = 60
CORNER_SETTINGS = settings(derandomize=True, max_examples=EXAMPLES, deadline=None,
                           suppress_health_check=[HealthCheck.function_scoped_fixture])


def small_or_edge(low, high):
    """Mostly the edges of [low, high], sometimes anything in between."""
    return st.one_of(st.sampled_from([low, low + 1, high]), st.integers(low, high))


@st.composite
def shapes(draw, extra):
    B = draw(small_or_edge(1, 512))
    R = draw(st.one_of(st.just(1), st.just(B), st.integers(1, B)))
    T = draw(small_or_edge(1, 8))
    dims = {name: draw(small_or_edge(low, high)) for name, (low, high) in extra.items()}
    return draw(st.integers(0, 2**31)), B, R, T, dims


EXTRA_DIMS = {
    "speculate_update": {},
    "speculate_set_value_by_flags_and_idx": {"M": (1, 24)},
    "speculate_set_stop_value_multi_seqs": {"S": (1, 4), "SL": (1, 6)},
    "speculate_schedule_cache": {"NB": (1, 16)},
    "recover_decode_task": {"NB": (1, 16)},
    "speculate_clear_accept_nums": {},
    "speculate_save_output": {},
}


@pytest.mark.parametrize("op", list(EXTRA_DIMS))
def test_op_matches_reference_at_shape_corners(op, backend):
    """OPS §2.1: bit-identical to the reference for edge shapes."""

    @CORNER_SETTINGS
    @given(shapes(EXTRA_DIMS[op]))
    def check(drawn):
        seed, B, R, T, dims = drawn
        case = gen_inputs(op, seed, B, R, T, **dims)
        context = f"{op} on {backend}, seed={seed}, B={B}, R={R}, T={T}, {dims}"
        expected, expected_result = run_reference(case)
        actual, actual_result = run_op(case, backend)
        assert_states_equal(actual, expected, context)
        assert_results_equal(actual_result, expected_result, context)

    check()
