"""`speculate_update` decision table (OPS §5.1), hand-built cases (C2) and regressions (C6)."""

import pytest

from reference.inputs import OpCase

from .hand_cases import HandCase, check_hand_case, flags, i32, i64


def update(*, T, enc, dec, adn, n, stop, stlt, blk, mr, draft, accept, not_need_stop=False, column=False):
    """B = len(enc), R = len(stlt). `column` stores per-slot vectors as [B, 1] instead of [B]."""
    shape = (lambda a: a.reshape(-1, 1)) if column else (lambda a: a)
    return OpCase("speculate_update", {
        "seq_lens_encoder": shape(i32(enc)),
        "seq_lens_decoder": shape(i32(dec)),
        "not_need_stop": flags([not_need_stop]),
        "draft_tokens": i64(draft),
        "actual_draft_token_nums": shape(i32(adn)),
        "accept_tokens": i64(accept),
        "accept_num": shape(i32(n)),
        "stop_flags": shape(flags(stop)),
        "seq_lens_this_time": shape(i32(stlt)),
        "is_block_step": shape(flags(blk)),
        "mask_rollback": shape(i32(mr)),
    })


CASES = [
    HandCase("row_C_stopped_slot_adds_accepted_tokens",  # the PD first-round EOS (PD_MTP_FLOW §8)
             update(T=3, enc=[0], dec=[10], adn=[2], n=[2], stop=[True], stlt=[3], blk=[False], mr=[7],
                    draft=[[5, 6, 7]], accept=[[8, 9, 4]], not_need_stop=True),
             {"seq_lens_decoder": [12], "mask_rollback": [0], "actual_draft_token_nums": [1],
              "draft_tokens": [[9, 6, 7]], "not_need_stop": [False]}),
    HandCase("row_C_stopped_prefill_slot_adds_accepted_then_folds",  # stopped + enc > 0
             update(T=2, enc=[4], dec=[0], adn=[1], n=[1], stop=[True], stlt=[4], blk=[False], mr=[3],
                    draft=[[5, 6]], accept=[[8, 9]]),
             {"seq_lens_decoder": [5], "seq_lens_encoder": [0], "mask_rollback": [0],
              "draft_tokens": [[8, 6]], "not_need_stop": [False]}),
    HandCase("row_D_all_drafts_accepted_grows_draft_length_by_two",
             update(T=4, enc=[0], dec=[20], adn=[1], n=[2], stop=[False], stlt=[4], blk=[False], mr=[0],
                    draft=[[1, 2, 3, 4]], accept=[[11, 12, 13, 14]]),
             {"seq_lens_decoder": [22], "mask_rollback": [2], "actual_draft_token_nums": [3],
              "draft_tokens": [[12, 2, 3, 4]], "not_need_stop": [True]}),
    HandCase("row_D_all_accepted_grows_by_one_at_the_width_limit",
             update(T=4, enc=[0], dec=[20], adn=[2], n=[3], stop=[False], stlt=[3], blk=[False], mr=[5],
                    draft=[[1, 2, 3, 4]], accept=[[11, 12, 13, 14]]),
             {"seq_lens_decoder": [23], "mask_rollback": [0], "actual_draft_token_nums": [3],
              "draft_tokens": [[13, 2, 3, 4]], "not_need_stop": [True]}),
    HandCase("row_D_all_accepted_at_full_width_stays_T_minus_1_with_n_equal_T",
             update(T=4, enc=[0], dec=[20], adn=[3], n=[4], stop=[False], stlt=[4], blk=[False], mr=[5],
                    draft=[[1, 2, 3, 4]], accept=[[11, 12, 13, 14]]),
             {"seq_lens_decoder": [24], "mask_rollback": [0], "actual_draft_token_nums": [3],
              "draft_tokens": [[14, 2, 3, 4]], "not_need_stop": [True]}),
    HandCase("row_D_rejected_draft_shrinks_length_but_not_below_one",
             update(T=4, enc=[0, 0], dec=[20, 30], adn=[3, 1], n=[2, 1], stop=[False, False], stlt=[4, 2],
                    blk=[False, False], mr=[0, 0], draft=[[1, 2, 3, 4], [5, 6, 7, 8]],
                    accept=[[11, 12, 13, 14], [15, 16, 17, 18]]),
             {"seq_lens_decoder": [22, 31], "mask_rollback": [2, 1], "actual_draft_token_nums": [2, 1],
              "draft_tokens": [[12, 2, 3, 4], [15, 6, 7, 8]], "not_need_stop": [True]}),
    HandCase("row_D_n_zero_leaves_seed_untouched",  # C6: no read of accept_tokens[b, -1] (defect D5)
             update(T=3, enc=[0, 0], dec=[7, 9], adn=[2, 2], n=[0, 0], stop=[False, False], stlt=[3, 1],
                    blk=[False, False], mr=[0, 0], draft=[[1, 2, 3], [4, 5, 6]], accept=[[7, 8, 9], [10, 11, 12]]),
             {"mask_rollback": [3, 1], "actual_draft_token_nums": [1, 2], "not_need_stop": [True]}),
    HandCase("row_D_T1_single_token_no_adaptation",
             update(T=1, enc=[0], dec=[3], adn=[1], n=[1], stop=[False], stlt=[1], blk=[False], mr=[4],
                    draft=[[1]], accept=[[2**40 + 5]], column=True),
             {"seq_lens_decoder": [4], "mask_rollback": [0], "draft_tokens": [[2**40 + 5]],
              "not_need_stop": [True]}),
    HandCase("row_D_T8_wider_than_six",
             update(T=8, enc=[0], dec=[100], adn=[7], n=[8], stop=[False], stlt=[8], blk=[False], mr=[1],
                    draft=[list(range(1, 9))], accept=[list(range(21, 29))]),
             {"seq_lens_decoder": [108], "mask_rollback": [0], "actual_draft_token_nums": [7],
              "draft_tokens": [[28, 2, 3, 4, 5, 6, 7, 8]], "not_need_stop": [True]}),
    HandCase("row_E_prefill_folds_encoder_into_decoder",
             update(T=2, enc=[5], dec=[3], adn=[2], n=[1], stop=[False], stlt=[5], blk=[False], mr=[9],
                    draft=[[1, 2]], accept=[[8, 9]]),
             {"seq_lens_decoder": [8], "seq_lens_encoder": [0], "mask_rollback": [0], "draft_tokens": [[8, 2]],
              "not_need_stop": [True]}),
    HandCase("row_B_parked_slot_untouched_and_not_counted",
             update(T=2, enc=[3], dec=[4], adn=[1], n=[2], stop=[True], stlt=[2], blk=[True], mr=[5],
                    draft=[[1, 2]], accept=[[8, 9]]),
             {"not_need_stop": [True]}),
    HandCase("row_A_padding_slots_untouched_and_counted_R_less_than_B",
             update(T=2, enc=[0, -7, 99], dec=[10, -1, 5], adn=[1, 0, 9], n=[1, -4, 9], stop=[False, False, False],
                    stlt=[1], blk=[False, False, False], mr=[0, 3, 4], draft=[[1, 2], [3, 4], [5, 6]],
                    accept=[[7, 8], [9, 10], [11, 12]]),
             {"seq_lens_decoder": [11, -1, 5], "mask_rollback": [0, 3, 4], "draft_tokens": [[7, 2], [3, 4], [5, 6]],
              "not_need_stop": [True]}),
    HandCase("not_need_stop_false_when_every_slot_stopped_or_padding",
             update(T=2, enc=[0, 0, 0], dec=[1, 2, 3], adn=[1, 1, 1], n=[0, 0, 1], stop=[True, True, False],
                    stlt=[0, 0], blk=[False, False, False], mr=[0, 0, 0], draft=[[1, 2], [3, 4], [5, 6]],
                    accept=[[7, 8], [9, 10], [11, 12]], not_need_stop=True),
             {"not_need_stop": [False]}),
]


@pytest.mark.parametrize("hc", CASES, ids=lambda hc: hc.name)
def test_update_decision_table_rows(hc, backend):
    """OPS §5.1 rows A-E, adaptive draft length, prefill folding, seed token, not_need_stop (C2, C6)."""
    check_hand_case(hc, backend)
