"""`speculate_schedule_cache` decision table (OPS §5.4), hand-built cases (C2) and regressions (C6).

Unless a case says otherwise: T = 2, NB = 4, block_size = 4, K = 1 (lookahead 2K + 2 = 4).
"""

import pytest

from reference.inputs import OpCase

from .hand_cases import HandCase, check_hand_case, flags, i32, i64


def schedule(*, tables, stop, prompt, dec, stlt, prefill_one_step_stop=False, block_size=4, K=1,
             not_need_stop=True):
    """B = len(stop); R = len(stlt). Other per-slot fields get distinct recognisable values."""
    B = len(stop)
    return OpCase("speculate_schedule_cache", {
        "draft_tokens": i64([[100 + 10 * b + j for j in range(2)] for b in range(B)]),
        "block_tables": i32(tables),
        "stop_flags": flags(stop),
        "prompt_lens": i64(prompt),
        "seq_lens_this_time": i32(stlt),
        "seq_lens_encoder": i32([3] * B),
        "seq_lens_decoder": i32(dec),
        "step_seq_lens_decoder": i32([-5] * B),
        "step_draft_tokens": i64([[-6, -6]] * B),
        "step_seq_lens_this_time": i32([-7] * B),
        "accept_num": i32([2] * B),
        "accept_tokens": i64([[200 + 10 * b + j for j in range(2)] for b in range(B)]),
        "is_block_step": flags([False] * B),
        "not_need_stop": flags([not_need_stop]),
    }, {"block_size": block_size, "max_draft_tokens": K, "prefill_one_step_stop": prefill_one_step_stop})


STOPPED_BY_PRE = {"stop_flags": [True], "seq_lens_this_time": [0], "seq_lens_decoder": [0],
                  "seq_lens_encoder": [0], "accept_num": [0]}

CASES = [
    HandCase("row_Stp_stopped_slot_untouched_and_counted",
             schedule(tables=[[-1] * 4], stop=[True], prompt=[3], dec=[5], stlt=[2]),
             {"not_need_stop": [False]}),
    HandCase("row_Pre_unfinished_prefill_chunk_is_stopped",
             schedule(tables=[[0, 1, 2, 3]], stop=[False], prompt=[8], dec=[3], stlt=[3]),
             {**STOPPED_BY_PRE, "not_need_stop": [False]}),
    HandCase("row_Pre_compares_prompt_lens_as_int64",  # 2^32 + 1 would truncate to 1 < dec in int32
             schedule(tables=[[0, 1, 2, 3]], stop=[False], prompt=[2**32 + 1], dec=[5], stlt=[2]),
             {**STOPPED_BY_PRE, "not_need_stop": [False]}),
    HandCase("row_One_prefill_instance_stops_after_one_step",
             schedule(tables=[[0, 1, 2, 3]], stop=[False], prompt=[8], dec=[8], stlt=[2],
                      prefill_one_step_stop=True),
             {**STOPPED_BY_PRE, "not_need_stop": [False]}),
    HandCase("row_Park_missing_lookahead_block_parks_and_saves_state",  # idx = (5 + 4) // 4 = 2
             schedule(tables=[[0, 1, -1, -1]], stop=[False], prompt=[3], dec=[5], stlt=[2]),
             {"is_block_step": [True], "step_seq_lens_this_time": [2], "seq_lens_this_time": [0],
              "stop_flags": [True], "step_seq_lens_decoder": [5], "seq_lens_decoder": [0], "accept_num": [0],
              "accept_tokens": [[-1, -1]], "step_draft_tokens": [[100, 101]], "not_need_stop": [False]}),
    HandCase("row_Park_T8_moves_whole_rows",
             OpCase("speculate_schedule_cache", {
                 "draft_tokens": i64([list(range(1, 9))]), "block_tables": i32([[0, -1]]),
                 "stop_flags": flags([False]), "prompt_lens": i64([1]), "seq_lens_this_time": i32([8]),
                 "seq_lens_encoder": i32([0]), "seq_lens_decoder": i32([1]), "step_seq_lens_decoder": i32([0]),
                 "step_draft_tokens": i64([[0] * 8]), "step_seq_lens_this_time": i32([0]),
                 "accept_num": i32([3]), "accept_tokens": i64([[2**40] * 8]), "is_block_step": flags([False]),
                 "not_need_stop": flags([True])},
                 {"block_size": 16, "max_draft_tokens": 7, "prefill_one_step_stop": False}),  # idx = 17 // 16
             {"is_block_step": [True], "step_seq_lens_this_time": [8], "seq_lens_this_time": [0],
              "stop_flags": [True], "step_seq_lens_decoder": [1], "seq_lens_decoder": [0], "accept_num": [0],
              "accept_tokens": [[-1] * 8], "step_draft_tokens": [list(range(1, 9))], "not_need_stop": [False]}),
    HandCase("row_Park_out_of_domain_negative_lookahead_clamps_to_block_0",
             schedule(tables=[[-1, 1, 2, 3]], stop=[False], prompt=[-200], dec=[-100], stlt=[2]),
             {"is_block_step": [True], "step_seq_lens_this_time": [2], "seq_lens_this_time": [0],
              "stop_flags": [True], "step_seq_lens_decoder": [-100], "seq_lens_decoder": [0], "accept_num": [0],
              "accept_tokens": [[-1, -1]], "step_draft_tokens": [[100, 101]], "not_need_stop": [False]}),
    # The Park boundary, exactly (OPS §5.4, PD_MTP_FLOW §7.1): the next step needs positions through dec + 2K + 2.
    HandCase("row_Park_boundary_lookahead_is_the_first_position_of_a_missing_block",  # (4 + 4) // 4 = 2, absent
             schedule(tables=[[0, 1, -1, -1]], stop=[False], prompt=[4], dec=[4], stlt=[2]),
             {"is_block_step": [True], "step_seq_lens_this_time": [2], "seq_lens_this_time": [0],
              "stop_flags": [True], "step_seq_lens_decoder": [4], "seq_lens_decoder": [0], "accept_num": [0],
              "accept_tokens": [[-1, -1]], "step_draft_tokens": [[100, 101]], "not_need_stop": [False]}),
    HandCase("row_Run_boundary_mirror_one_position_below_stays_in_the_last_present_block",  # (3 + 4) // 4 = 1
             schedule(tables=[[0, 1, -1, -1]], stop=[False], prompt=[3], dec=[3], stlt=[2]),
             {}),
    HandCase("row_Park_boundary_with_K2_lookahead_2K_plus_2",  # K = 2: (6 + 6) // 4 = 3, absent
             schedule(tables=[[0, 1, 2, -1]], stop=[False], prompt=[6], dec=[6], stlt=[2], K=2),
             {"is_block_step": [True], "step_seq_lens_this_time": [2], "seq_lens_this_time": [0],
              "stop_flags": [True], "step_seq_lens_decoder": [6], "seq_lens_decoder": [0], "accept_num": [0],
              "accept_tokens": [[-1, -1]], "step_draft_tokens": [[100, 101]], "not_need_stop": [False]}),
    HandCase("row_Run_boundary_mirror_with_K2",  # (5 + 6) // 4 = 2, present
             schedule(tables=[[0, 1, 2, -1]], stop=[False], prompt=[5], dec=[5], stlt=[2], K=2),
             {}),
    HandCase("row_Run_lookahead_block_present_keeps_decoding",
             schedule(tables=[[0, 1, 2, -1]], stop=[False], prompt=[3], dec=[5], stlt=[2]),
             {}),
    HandCase("row_Run_lookahead_past_the_table_does_not_park_or_read_next_row",  # idx = (13 + 4) // 4 = 4 = NB
             schedule(tables=[[0, 1, 2, 3], [-1, -1, -1, -1]], stop=[False, True], prompt=[3, 0], dec=[13, 0],
                      stlt=[2, 0]),
             {}),
    HandCase("padding_slots_are_counted_as_stopped_R_less_than_B",  # C6: 2 padding + 1 stopped = B
             schedule(tables=[[0, 1, 2, 3]] * 3, stop=[True, False, False], prompt=[0, 0, 0], dec=[5, 5, 5],
                      stlt=[0]),
             {"not_need_stop": [False]}),
    HandCase("padding_slots_untouched_while_a_real_slot_runs",
             schedule(tables=[[0, 1, 2, 3], [-1] * 4, [-1] * 4], stop=[False, False, False], prompt=[0, 9, 9],
                      dec=[5, 5, 5], stlt=[2], not_need_stop=False),
             {"not_need_stop": [True]}),
]


@pytest.mark.parametrize("hc", CASES, ids=lambda hc: hc.name)
def test_schedule_cache_decision_table_rows(hc, backend):
    """OPS §5.4 rows Pad, Stp, Pre, One, Park, Run and not_need_stop (C2, C6)."""
    check_hand_case(hc, backend)
