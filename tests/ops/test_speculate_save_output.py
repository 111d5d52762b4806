"""`speculate_save_output` (OPS §5.7): hand-built messages (C2) and the once-only preemption report (C6)."""

import numpy as np
import pytest

from reference.inputs import OpCase

from .hand_cases import HandCase, check_hand_case, flags, i32, i64
from .harness import call_op, to_paddle

BIG = 2**40


def save(*, accept, n, dec, prompt, preempted, not_need_stop=True, rank_id=0, save_each_rank=False,
         skip_prefill=True):
    return OpCase("speculate_save_output", {
        "accept_tokens": i64(accept),
        "accept_num": i32(n),
        "not_need_stop": flags([not_need_stop]),
        "seq_lens_decoder": i32(dec),
        "prompt_lens": i64(prompt),
        "preempted_idx": i32(preempted),
    }, {"rank_id": rank_id, "save_each_rank": save_each_rank, "skip_prefill": skip_prefill})


FOUR_SLOTS = dict(accept=[[5, 6], [7, 8], [BIG, 2**31], [9, 10]], n=[2, 1, 2, 0], dec=[10, 3, 10, 10],
                  prompt=[10, 8, 10, 10], preempted=[0, 0, 0, 1])

CASES = [
    HandCase("count_rules_preempted_hidden_and_reported_with_int64_tokens",
             save(**FOUR_SLOTS),
             {"preempted_idx": [0, 0, 0, 0]},
             [1, 4, 2, 0, 2, -9, 5, 6, 0, 0, BIG, 2**31, 0, 0]),
    HandCase("preempted_wins_over_hidden_prefill_slot",
             save(accept=[[5, 6], [7, 8]], n=[1, 2], dec=[0, 0], prompt=[4, 4], preempted=[1, 0]),
             {"preempted_idx": [0, 0]},
             [1, 2, -9, 0, 0, 0, 0, 0]),
    HandCase("not_need_stop_false_gives_negative_message_id",
             save(accept=[[5, 6]], n=[1], dec=[3], prompt=[3], preempted=[0], not_need_stop=False),
             {},
             [-1, 1, 1, 5, 0]),
    HandCase("skip_prefill_false_reports_prefill_slot_counts",
             save(accept=[[5, 6], [7, 8]], n=[1, 2], dec=[0, 9], prompt=[4, 4], preempted=[0, 0],
                  skip_prefill=False),
             {},
             [1, 2, 1, 2, 5, 0, 7, 8]),
    HandCase("prompt_lens_compared_as_int64",  # 2^32 + 1 would truncate to 1 <= dec
             save(accept=[[5, 6]], n=[2], dec=[5], prompt=[2**32 + 1], preempted=[0]),
             {},
             [1, 1, 0, 0, 0]),
    HandCase("recovery_stop_count_passes_through_without_tokens",
             save(accept=[[5, 6]], n=[-3], dec=[5], prompt=[5], preempted=[0]),
             {},
             [1, 1, -3, 0, 0]),
    HandCase("count_beyond_T_copies_at_most_T_tokens",  # out of domain; the decoder rejects it
             save(accept=[[5, 6]], n=[3], dec=[5], prompt=[5], preempted=[0]),
             {},
             [1, 1, 3, 5, 6]),
    HandCase("T8_and_column_vectors",
             OpCase("speculate_save_output", {
                 "accept_tokens": i64([list(range(BIG, BIG + 8))]), "accept_num": i32([[8]]),
                 "not_need_stop": flags([True]), "seq_lens_decoder": i32([[1]]), "prompt_lens": i64([[1]]),
                 "preempted_idx": i32([[0]])}, {"rank_id": 0, "save_each_rank": False, "skip_prefill": True}),
             {},
             [1, 1, 8, *range(BIG, BIG + 8)]),
    HandCase("other_rank_without_save_each_rank_returns_empty_and_keeps_preemption",
             save(**FOUR_SLOTS, rank_id=1),
             {},
             []),
    HandCase("other_rank_with_save_each_rank_reports",
             save(**FOUR_SLOTS, rank_id=2, save_each_rank=True),
             {"preempted_idx": [0, 0, 0, 0]},
             [1, 4, 2, 0, 2, -9, 5, 6, 0, 0, BIG, 2**31, 0, 0]),
]


@pytest.mark.parametrize("hc", CASES, ids=lambda hc: hc.name)
def test_save_output_message_layout_and_count_rules(hc, backend):
    """OPS §5.7 message words, count rules 1-3, rank gating (C2)."""
    check_hand_case(hc, backend)


def test_preemption_is_reported_exactly_once(backend):
    """OPS §5.7 rule 1 / OPS §8 C6: the first message reports -9 and clears preempted_idx; the next reports the
    count."""
    case = save(accept=[[5, 6]], n=[1], dec=[5], prompt=[5], preempted=[1])
    args = [to_paddle(a) for a in case.tensors.values()]
    first = call_op(case.op, backend, args, case.attrs).numpy()
    second = call_op(case.op, backend, args, case.attrs).numpy()
    np.testing.assert_array_equal(first, [1, 1, -9, 0, 0])
    np.testing.assert_array_equal(second, [1, 1, 1, 5, 0])
    np.testing.assert_array_equal(args[5].numpy(), [0])
