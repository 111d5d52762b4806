"""`speculate_clear_accept_nums` (OPS §5.6): hand-built cases (C2)."""

import pytest

from reference.inputs import OpCase

from .hand_cases import HandCase, check_hand_case, i32

CASES = [
    HandCase("slots_without_kv_get_zero_count_others_keep_theirs",
             OpCase("speculate_clear_accept_nums", {"accept_num": i32([3, 2, 0, 1]),
                                                    "seq_lens_decoder": i32([0, 5, 0, -2])}),
             {"accept_num": [0, 2, 0, 1]}),
    HandCase("single_slot_column_vectors",
             OpCase("speculate_clear_accept_nums", {"accept_num": i32([[4]]), "seq_lens_decoder": i32([[0]])}),
             {"accept_num": [[0]]}),
]


@pytest.mark.parametrize("hc", CASES, ids=lambda hc: hc.name)
def test_clear_accept_nums_rows(hc, backend):
    """OPS §5.6: accept_num[b] = 0 iff seq_lens_decoder[b] == 0 (C2)."""
    check_hand_case(hc, backend)
