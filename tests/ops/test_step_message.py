"""Step-message round trip and decoder validation (OPS §5.7, §8 C7)."""

import numpy as np
import paddle
import pytest

import reference

from .hand_cases import flags, i32, i64
from fastdeploy.model_executor.ops import step_message

from .harness import call_op, to_paddle

BIG = 2**40


def decoders():
    return [("reference", reference.decode_step_message), ("ops", step_message.decode_step_message)]


def test_constants_match_the_spec():
    """OPS §1 sentinel constants."""
    ops = step_message
    assert (ops.PREEMPTED_TOKEN_ID, ops.RECOVERY_STOP, ops.MSG_ID, ops.UNALLOCATED_BLOCK) == (-9, -3, 1, -1)


def test_round_trip_yields_per_slot_token_lists(backend):
    """C7: decode_step_message(speculate_save_output(...)) equals the per-slot lists written by hand, tokens >= 2^31
    included (C6)."""
    tensors = [i64([[BIG, 2**31, 7], [1, 2, 3], [4, 5, 6], [8, 9, 10], [11, 12, 13]]),  # accept_tokens [5, 3]
               i32([3, 2, 1, 0, -3]),                                                    # accept_num
               flags([False]),                                                           # not_need_stop
               i32([9, 2, 9, 9, 9]),                                                     # seq_lens_decoder
               i64([9, 5, 9, 9, 9]),                                                     # prompt_lens
               i32([0, 0, 1, 0, 0])]                                                     # preempted_idx
    msg = call_op("speculate_save_output", backend, [to_paddle(t) for t in tensors], [0, False, True])
    expected = (False, [[BIG, 2**31, 7], [], [-9], [], [-3]])
    for name, decode in decoders():
        assert decode(msg) == expected, name
        assert decode(msg.numpy()) == expected, name


def test_empty_message_decodes_to_none():
    """OPS §5.7: length 0 means no message this step."""
    for name, decode in decoders():
        assert decode(np.zeros([0], np.int64)) is None, name
        assert decode(paddle.zeros([0], dtype="int64")) is None, name


MALFORMED = {
    "shorter_than_header": [1],
    "bad_message_id": [2, 1, 0, 0],
    "zero_bsz": [1, 0, 0],
    "negative_bsz": [-1, -2, 0, 0],
    "no_token_rows": [1, 2, 0, 0],
    "rows_not_a_multiple_of_bsz": [1, 2, 0, 0, 5, 6, 7],
    "count_above_T": [1, 1, 3, 5, 6],
    "count_negative_not_a_sentinel": [1, 1, -4, 5, 6],
    "negative_token": [1, 1, 2, 5, -6],
}


@pytest.mark.parametrize("words", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_message_raises_value_error(words):
    """OPS §5.7 / C7: every validation rule of decode_step_message raises ValueError naming the function."""
    for name, decode in decoders():
        with pytest.raises(ValueError, match=r"^decode_step_message"):
            decode(np.asarray(words, np.int64))
