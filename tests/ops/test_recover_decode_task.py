"""`recover_decode_task` (OPS §5.5): hand-built cases (C2) and regressions (C6).

Unless a case says otherwise: NB = 3, block_size = 4, K = 1, so the speculative lookahead is 2K + 1 = 3.
"""

import pytest

from reference.inputs import OpCase

from .hand_cases import HandCase, check_hand_case, flags, i32, i64


def recover(*, tables, blk, step_dec, stlt, speculative=True, T=2, step_stlt=None, block_size=4, K=1):
    """B = len(blk), R = len(stlt). Parked-looking state: stop_flags true, decoder 0, encoder 9."""
    B = len(blk)
    optional = {"draft_tokens": None, "step_draft_tokens": None, "step_seq_lens_this_time": None}
    if speculative:
        optional = {"draft_tokens": i64([[-1] * T] * B),
                    "step_draft_tokens": i64([[2**40 + 10 * b + j for j in range(T)] for b in range(B)]),
                    "step_seq_lens_this_time": i32(step_stlt if step_stlt is not None else [2] * B)}
    return OpCase("recover_decode_task", {
        "stop_flags": flags([True] * B),
        "seq_lens_this_time": i32(stlt),
        "seq_lens_encoder": i32([9] * B),
        "seq_lens_decoder": i32([0] * B),
        "step_seq_lens_decoder": i32(step_dec),
        "block_tables": i32(tables),
        "is_block_step": flags(blk),
        **optional,
    }, {"block_size": block_size, "max_draft_tokens": K})


RESTORED = {"is_block_step": [False], "stop_flags": [False], "seq_lens_encoder": [0]}

CASES = [
    HandCase("not_parked_slot_untouched",
             recover(tables=[[0, 1, 2]], blk=[False], step_dec=[5], stlt=[0]),
             {}),
    HandCase("parked_slot_stays_parked_while_block_missing",  # idx = (5 + 3) // 4 = 2
             recover(tables=[[0, 1, -1]], blk=[True], step_dec=[5], stlt=[0]),
             {}),
    # The resume boundary, exactly (OPS §5.5 step 1): the speculative slot needs the block of step_dec + 2K + 1.
    # The case above (step_dec 5, idx 2 absent) is the boundary; these are its mirror one position below and the
    # same pair for K = 2 and for the non-speculative variant (extra 0).
    HandCase("speculative_resume_boundary_mirror_one_position_below_resumes",  # (4 + 3) // 4 = 1, present
             recover(tables=[[0, 1, -1]], blk=[True], step_dec=[4], stlt=[0]),
             {**RESTORED, "seq_lens_decoder": [4], "seq_lens_this_time": [2],
              "draft_tokens": [[2**40, 2**40 + 1]]}),
    HandCase("speculative_K2_boundary_stays_parked",  # K = 2: (3 + 5) // 4 = 2, absent
             recover(tables=[[0, 1, -1]], blk=[True], step_dec=[3], stlt=[0], K=2),
             {}),
    HandCase("speculative_K2_boundary_mirror_resumes",  # (2 + 5) // 4 = 1, present
             recover(tables=[[0, 1, -1]], blk=[True], step_dec=[2], stlt=[0], K=2),
             {**RESTORED, "seq_lens_decoder": [2], "seq_lens_this_time": [2],
              "draft_tokens": [[2**40, 2**40 + 1]]}),
    HandCase("non_speculative_boundary_stays_parked",  # 8 // 4 = 2, absent
             recover(tables=[[0, 1, -1]], blk=[True], step_dec=[8], stlt=[0], speculative=False),
             {}),
    HandCase("non_speculative_boundary_mirror_resumes",  # 7 // 4 = 1, present
             recover(tables=[[0, 1, -1]], blk=[True], step_dec=[7], stlt=[0], speculative=False),
             {**RESTORED, "seq_lens_decoder": [7], "seq_lens_this_time": [1]}),
    HandCase("speculative_resume_restores_saved_state_and_drafts",
             recover(tables=[[0, 1, 7]], blk=[True], step_dec=[5], stlt=[0]),
             {**RESTORED, "seq_lens_decoder": [5], "seq_lens_this_time": [2],
              "draft_tokens": [[2**40, 2**40 + 1]]}),
    HandCase("speculative_resume_copies_only_saved_length",
             recover(tables=[[0, 1, 7]], blk=[True], step_dec=[5], stlt=[0], T=4, step_stlt=[3]),
             {**RESTORED, "seq_lens_decoder": [5], "seq_lens_this_time": [3],
              "draft_tokens": [[2**40, 2**40 + 1, 2**40 + 2, -1]]}),
    HandCase("speculative_resume_with_zero_saved_length_copies_nothing",
             recover(tables=[[0, 1, 7]], blk=[True], step_dec=[5], stlt=[0], step_stlt=[0]),
             {**RESTORED, "seq_lens_decoder": [5], "seq_lens_this_time": [0]}),
    HandCase("speculative_resume_T8_copies_the_whole_row",  # C6: wider than six, int64 tokens
             recover(tables=[[0, 1, 7]], blk=[True], step_dec=[5], stlt=[0], T=8, step_stlt=[8]),
             {**RESTORED, "seq_lens_decoder": [5], "seq_lens_this_time": [8],
              "draft_tokens": [[2**40 + j for j in range(8)]]}),
    HandCase("block_index_clamped_to_row_end_does_not_read_next_row",  # C6 (defect D7): idx 5 -> NB - 1 = 2
             recover(tables=[[0, 1, -1], [4, 5, 6]], blk=[True, False], step_dec=[17, 0], stlt=[0, 0]),
             {}),
    HandCase("block_index_clamped_to_row_end_resumes_when_last_block_present",
             recover(tables=[[0, 1, 2], [-1, -1, -1]], blk=[True, False], step_dec=[17, 0], stlt=[0, 0]),
             {"is_block_step": [False, False], "stop_flags": [False, True], "seq_lens_encoder": [0, 9],
              "seq_lens_decoder": [17, 0], "seq_lens_this_time": [2, 0],
              "draft_tokens": [[2**40, 2**40 + 1], [-1, -1]]}),
    HandCase("non_speculative_resume_uses_no_lookahead_and_one_token",  # idx = 5 // 4 = 1
             recover(tables=[[0, 1, -1]], blk=[True], step_dec=[5], stlt=[0], speculative=False),
             {**RESTORED, "seq_lens_decoder": [5], "seq_lens_this_time": [1]}),
    HandCase("padding_slots_untouched_R_less_than_B",
             recover(tables=[[0, 1, 2], [0, 1, 2]], blk=[True, True], step_dec=[1, 1], stlt=[0]),
             {"is_block_step": [False, True], "stop_flags": [False, True], "seq_lens_encoder": [0, 9],
              "seq_lens_decoder": [1, 0], "seq_lens_this_time": [2],
              "draft_tokens": [[2**40, 2**40 + 1], [-1, -1]]}),
]


@pytest.mark.parametrize("hc", CASES, ids=lambda hc: hc.name)
def test_recover_decision_rows(hc, backend):
    """OPS §5.5 steps 1-3, both variants, index clamp (C2, C6)."""
    check_hand_case(hc, backend)
