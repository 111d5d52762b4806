"""`speculate_set_value_by_flags_and_idx` decision table (OPS §5.2), hand-built cases (C2) and regressions (C6)."""

import pytest

from reference.inputs import OpCase

from .hand_cases import HandCase, check_hand_case, flags, i32, i64

M0 = -1  # untouched pre_ids entries


def set_value(*, pre_ids, accept, n, stop, enc, dec, step_idx, R=None):
    """B = len(n); `seq_lens_this_time` has R elements (length only: its values are never read)."""
    B = len(n)
    return OpCase("speculate_set_value_by_flags_and_idx", {
        "pre_ids_all": i64(pre_ids),
        "accept_tokens": i64(accept),
        "accept_num": i32(n),
        "stop_flags": flags(stop),
        "seq_lens_this_time": i32([-123] * (R or B)),
        "seq_lens_encoder": i32(enc),
        "seq_lens_decoder": i32(dec),
        "step_idx": i64(step_idx),
    })


CASES = [
    HandCase("row_S_stopped_slot_clears_count_and_decoder_without_writing_history",
             set_value(pre_ids=[[M0] * 6], accept=[[7, 8, 9]], n=[2], stop=[True], enc=[0], dec=[12],
                       step_idx=[4]),
             {"accept_num": [0], "seq_lens_decoder": [0]}),
    HandCase("row_Z_idle_slot_untouched",
             set_value(pre_ids=[[M0] * 6], accept=[[7, 8, 9]], n=[2], stop=[False], enc=[0], dec=[0],
                       step_idx=[4]),
             {}),
    HandCase("row_W_writes_accepted_run_ending_at_step_idx",
             set_value(pre_ids=[[M0] * 8], accept=[[11, 12, 13]], n=[2], stop=[False], enc=[0], dec=[30],
                       step_idx=[5]),
             {"pre_ids_all": [[M0, M0, M0, M0, 11, 12, M0, M0]]}),
    HandCase("row_W_prefill_slot_with_zero_decoder_writes",
             set_value(pre_ids=[[M0] * 4], accept=[[2**40 + 1, 12]], n=[1], stop=[False], enc=[5], dec=[0],
                       step_idx=[1]),
             {"pre_ids_all": [[M0, 2**40 + 1, M0, M0]]}),
    HandCase("row_W_full_run_n_equal_T8",
             set_value(pre_ids=[[M0] * 12], accept=[list(range(21, 29))], n=[8], stop=[False], enc=[0], dec=[9],
                       step_idx=[10]),
             {"pre_ids_all": [[M0, M0, M0, 21, 22, 23, 24, 25, 26, 27, 28, M0]]}),
    HandCase("row_W_step_idx_zero_writes_nothing",
             set_value(pre_ids=[[M0] * 4], accept=[[7, 8]], n=[1], stop=[False], enc=[0], dec=[3], step_idx=[0]),
             {}),
    HandCase("row_W_n_zero_writes_nothing",
             set_value(pre_ids=[[M0] * 4], accept=[[7, 8]], n=[0], stop=[False], enc=[0], dec=[3], step_idx=[2]),
             {}),
    HandCase("row_W_step_idx_below_T_minus_1_at_slot_0_skips_positions_before_the_row",  # C6 (defect D6)
             set_value(pre_ids=[[M0] * 4, [M0] * 4], accept=[[31, 32, 33], [41, 42, 43]], n=[3, 3],
                       stop=[False, False], enc=[0, 0], dec=[2, 2], step_idx=[1, 0]),
             {"pre_ids_all": [[32, 33, M0, M0], [M0] * 4]}),
    HandCase("row_W_step_idx_below_T_minus_1_at_slot_1_keeps_previous_row",  # C6 (defect D6)
             set_value(pre_ids=[[M0] * 4, [M0] * 4], accept=[[31, 32, 33], [41, 42, 43]], n=[0, 3],
                       stop=[False, False], enc=[0, 0], dec=[2, 2], step_idx=[3, 1]),
             {"pre_ids_all": [[M0] * 4, [42, 43, M0, M0]]}),
    HandCase("row_W_positions_past_the_row_end_are_skipped",  # out-of-domain guard: s >= M
             set_value(pre_ids=[[M0] * 4, [M0] * 4], accept=[[31, 32, 33], [41, 42, 43]], n=[3, 0],
                       stop=[False, False], enc=[0, 0], dec=[2, 2], step_idx=[5, 1]),
             {"pre_ids_all": [[M0, M0, M0, 31], [M0] * 4]}),
    HandCase("padding_slots_untouched_R_less_than_B",
             set_value(pre_ids=[[M0] * 4, [M0] * 4], accept=[[31, 32], [41, 42]], n=[1, 2], stop=[False, True],
                       enc=[0, 0], dec=[2, 2], step_idx=[1, 3], R=1),
             {"pre_ids_all": [[M0, 31, M0, M0], [M0] * 4]}),
]


@pytest.mark.parametrize("hc", CASES, ids=lambda hc: hc.name)
def test_set_value_by_flags_decision_table_rows(hc, backend):
    """OPS §5.2 rows S, Z, W with the per-element guarded write (C2, C6)."""
    check_hand_case(hc, backend)
