"""`speculate_set_stop_value_multi_seqs` (OPS §5.3): hand-built cases (C2) and regressions (C6).

Unless a case says otherwise: T = 4, M = 10, S = 2, SL = 3, end_ids = [99, 98], pre_ids[b, k] = 10 + k for the
history (generated token k), so generated token k of the history is 10 + k and accept position p is token s-n+1+p.
"""

import pytest

from reference.inputs import OpCase

from .hand_cases import HandCase, check_hand_case, flags, i32, i64

END = 99
HISTORY = list(range(10, 20))  # pre_ids row: index k holds 10 + k (index 0 is reserved and never compared)


def set_stop(*, accept, n, step_idx, stop, stop_seqs, min_tokens, pre_ids=None, R=None, SL=3):
    """B = len(n). `stop_seqs[b]` lists the slot's sequences; lengths are taken from them, padded with -1 to SL."""
    B = len(n)
    S = max(len(seqs) for seqs in stop_seqs)
    table = [[list(seq) + [-1] * (SL - len(seq)) for seq in seqs] + [[-1] * SL] * (S - len(seqs))
             for seqs in stop_seqs]
    lengths = [[len(seq) for seq in seqs] + [0] * (S - len(seqs)) for seqs in stop_seqs]
    return OpCase("speculate_set_stop_value_multi_seqs", {
        "accept_tokens": i64(accept),
        "accept_num": i32(n),
        "pre_ids": i64(pre_ids if pre_ids is not None else [HISTORY] * B),
        "step_idx": i64(step_idx),
        "stop_flags": flags(stop),
        "seq_lens": i32([7] * (R or B)),
        "stop_seqs": i64(table),
        "stop_seqs_len": i32(lengths),
        "end_ids": i64([END, 98]),
        "min_tokens": i64(min_tokens),
    })


def with_lengths(case: OpCase, lengths) -> OpCase:
    case.tensors["stop_seqs_len"] = i32(lengths)
    return case


ACC = [30, 31, 32, 33]  # s = 6, n = 4: accept positions hold generated tokens 3, 4, 5, 6; history tokens 1, 2

CASES = [
    HandCase("match_inside_accepted_run_truncates_and_writes_end_token",
             set_stop(accept=[ACC], n=[4], step_idx=[6], stop=[False], stop_seqs=[[[30, 31]]], min_tokens=[0]),
             {"accept_num": [3], "accept_tokens": [[30, 31, END, 33]], "stop_flags": [True]}),
    HandCase("match_spanning_history_and_accepted_run",
             set_stop(accept=[ACC], n=[4], step_idx=[6], stop=[False], stop_seqs=[[[12, 30]]], min_tokens=[0]),
             {"accept_num": [2], "accept_tokens": [[30, END, 32, 33]], "stop_flags": [True]}),
    HandCase("match_entirely_in_history_cuts_first_accepted_token",
             set_stop(accept=[ACC], n=[4], step_idx=[6], stop=[False], stop_seqs=[[[11, 12]]], min_tokens=[0]),
             {"accept_num": [1], "accept_tokens": [[END, 31, 32, 33]], "stop_flags": [True]}),
    HandCase("window_needing_reserved_token_0_never_matches",
             # s = 2, n = 1: accept position 0 is token 2, the window [token 0, token 1] = [10, 11] needs index 0
             set_stop(accept=[ACC], n=[1], step_idx=[2], stop=[False], stop_seqs=[[[10, 11]]], min_tokens=[0]),
             {}),
    HandCase("not_enough_history_never_matches",
             set_stop(accept=[ACC], n=[1], step_idx=[1], stop=[False], stop_seqs=[[[10, 11]]], min_tokens=[0]),
             {}),
    HandCase("sequence_ending_at_last_accepted_position_waits_for_next_step",
             set_stop(accept=[ACC], n=[4], step_idx=[6], stop=[False], stop_seqs=[[[32, 33]]], min_tokens=[0]),
             {}),
    HandCase("slot_stopped_in_an_earlier_step_is_skipped",  # accept_num = 0
             set_stop(accept=[ACC], n=[0], step_idx=[6], stop=[True], stop_seqs=[[[11, 12]]], min_tokens=[0]),
             {}),
    HandCase("slot_stopped_by_verify_this_step_is_scanned",  # PD_MTP_FLOW §10.2 rule 2
             set_stop(accept=[[30, 31, 32, END]], n=[4], step_idx=[6], stop=[True], stop_seqs=[[[30]]],
                      min_tokens=[0]),
             {"accept_num": [2], "accept_tokens": [[30, END, 32, END]]}),
    HandCase("earliest_position_wins_over_sequence_order",
             set_stop(accept=[ACC], n=[4], step_idx=[6], stop=[False], stop_seqs=[[[31, 32], [12]]],
                      min_tokens=[0]),
             {"accept_num": [1], "accept_tokens": [[END, 31, 32, 33]], "stop_flags": [True]}),
    HandCase("min_tokens_gate_at_threshold_allows_match",  # output 3,4 + end = 5 tokens >= min_tokens 5
             set_stop(accept=[ACC], n=[4], step_idx=[6], stop=[False], stop_seqs=[[[30, 31]]], min_tokens=[5]),
             {"accept_num": [3], "accept_tokens": [[30, 31, END, 33]], "stop_flags": [True]}),
    HandCase("min_tokens_gate_just_above_blocks_match",  # C6: 5 tokens < 6
             set_stop(accept=[ACC], n=[4], step_idx=[6], stop=[False], stop_seqs=[[[30, 31]]], min_tokens=[6]),
             {}),
    HandCase("min_tokens_gate_is_per_position_not_per_step",  # s = 6 >= 4, but a match at a = 0 has 3 tokens
             set_stop(accept=[ACC], n=[4], step_idx=[6], stop=[False], stop_seqs=[[[11, 12], [31]]],
                      min_tokens=[4]),
             {"accept_num": [3], "accept_tokens": [[30, 31, END, 33]], "stop_flags": [True]}),
    HandCase("single_token_step_at_min_tokens_matches",  # n = 1: the gate is s >= min_tokens
             set_stop(accept=[ACC], n=[1], step_idx=[5], stop=[False], stop_seqs=[[[13, 14]]], min_tokens=[5]),
             {"accept_num": [1], "accept_tokens": [[END, 31, 32, 33]], "stop_flags": [True]}),
    HandCase("single_token_step_just_below_min_tokens_does_not_match",
             set_stop(accept=[ACC], n=[1], step_idx=[4], stop=[False], stop_seqs=[[[12, 13]]], min_tokens=[5]),
             {}),
    HandCase("per_request_stop_sequences_differ_between_slots",  # C6 (defect D13)
             set_stop(accept=[[40, 41, 30, 31], [30, 31, 40, 41]], n=[4, 4], step_idx=[6, 6], stop=[False, False],
                      stop_seqs=[[[30, 31]], [[40, 41]]], min_tokens=[0, 0]),
             {}),
    HandCase("per_request_stop_sequences_each_slot_matches_its_own",
             set_stop(accept=[[30, 31, 40, 41], [40, 41, 30, 31]], n=[4, 4], step_idx=[6, 6], stop=[False, False],
                      stop_seqs=[[[30]], [[41]]], min_tokens=[0, 0]),
             {"accept_num": [2, 3], "accept_tokens": [[30, END, 40, 41], [40, 41, END, 31]],
              "stop_flags": [True, True]}),
    HandCase("unused_entry_with_length_zero_never_matches",
             with_lengths(set_stop(accept=[ACC], n=[4], step_idx=[6], stop=[False], stop_seqs=[[[30, 31]]],
                                   min_tokens=[0]), [[0]]),
             {}),
    HandCase("length_beyond_SL_never_matches",  # out-of-domain guard
             with_lengths(set_stop(accept=[ACC], n=[4], step_idx=[6], stop=[False], stop_seqs=[[[30, 31]]],
                                   min_tokens=[0], SL=2), [[3]]),
             {}),
    HandCase("history_index_past_the_row_never_matches",  # out-of-domain guard m >= M (M = 4, s = 6)
             set_stop(accept=[ACC], n=[1], step_idx=[6], stop=[False], stop_seqs=[[[15]]], min_tokens=[0],
                      pre_ids=[[10, 11, 12, 13]]),
             {}),
    HandCase("T1_step_matches_on_history",
             set_stop(accept=[[50]], n=[1], step_idx=[3], stop=[False], stop_seqs=[[[11, 12]]], min_tokens=[0]),
             {"accept_num": [1], "accept_tokens": [[END]], "stop_flags": [True]}),
    HandCase("T8_match_late_in_the_run",
             set_stop(accept=[list(range(30, 38))], n=[8], step_idx=[9], stop=[False], stop_seqs=[[[34, 35, 36]]],
                      min_tokens=[0]),
             {"accept_num": [8], "accept_tokens": [[30, 31, 32, 33, 34, 35, 36, END]], "stop_flags": [True]}),
    HandCase("padding_slots_untouched_R_less_than_B",
             set_stop(accept=[ACC, ACC], n=[4, 4], step_idx=[6, 6], stop=[False, False],
                      stop_seqs=[[[99, 98]], [[30]]], min_tokens=[0, 0], R=1),
             {}),
]


@pytest.mark.parametrize("hc", CASES, ids=lambda hc: hc.name)
def test_set_stop_value_cases(hc, backend):
    """OPS §5.3 scan, per-position min_tokens gate, match test and guards (C2, C6)."""
    check_hand_case(hc, backend)
