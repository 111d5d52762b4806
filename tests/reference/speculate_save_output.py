"""Reference of `speculate_save_output` (OPS §5.7): build the step message from this step's accept results."""

import numpy as np

from .checks import BOOL, INT32, INT64, ArgChecker, flat
from .step_message import MSG_ID, PREEMPTED_TOKEN_ID

OP = "speculate_save_output"
ARG_NAMES = ("accept_tokens", "accept_num", "not_need_stop", "seq_lens_decoder", "prompt_lens", "preempted_idx")


def check(accept_tokens, accept_num, not_need_stop, seq_lens_decoder, prompt_lens, preempted_idx, rank_id,
          save_each_rank, skip_prefill):
    chk = ArgChecker(OP)
    chk.array("accept_tokens", accept_tokens, INT64)
    if accept_tokens.ndim != 2 or accept_tokens.shape[0] < 1 or accept_tokens.shape[1] < 1:
        chk.fail("accept_tokens", f"expected shape [bsz >= 1, T >= 1] (got {list(accept_tokens.shape)})")
    bsz, T = accept_tokens.shape
    chk.per_slot("accept_num", accept_num, INT32, bsz)
    chk.array("not_need_stop", not_need_stop, BOOL)
    if not_need_stop.size != 1:
        chk.fail("not_need_stop", f"expected exactly 1 element (got {not_need_stop.size})")
    chk.per_slot("seq_lens_decoder", seq_lens_decoder, INT32, bsz)
    chk.per_slot("prompt_lens", prompt_lens, INT64, bsz)
    chk.per_slot("preempted_idx", preempted_idx, INT32, bsz)
    chk.int_attr("rank_id", rank_id, 0)
    chk.bool_attr("save_each_rank", save_each_rank)
    chk.bool_attr("skip_prefill", skip_prefill)
    chk.no_shared_storage(list(zip(ARG_NAMES, (accept_tokens, accept_num, not_need_stop, seq_lens_decoder,
                                               prompt_lens, preempted_idx))))
    return bsz, T


def speculate_save_output(accept_tokens,     # [bsz, T] int64, read
                          accept_num,        # [bsz] / [bsz,1] int32, read
                          not_need_stop,     # [1] bool (host), read
                          seq_lens_decoder,  # [bsz] / [bsz,1] int32, read
                          prompt_lens,       # [bsz] / [bsz,1] int64, read
                          preempted_idx,     # [bsz] / [bsz,1] int32 (host), cleared after reporting
                          rank_id, save_each_rank, skip_prefill) -> np.ndarray:
    """Returns the message: int64 [2 + bsz + bsz*T], or int64 [0] when this rank does not report."""
    bsz, T = check(accept_tokens, accept_num, not_need_stop, seq_lens_decoder, prompt_lens, preempted_idx, rank_id,
                   save_each_rank, skip_prefill)
    if not save_each_rank and rank_id > 0:
        return np.zeros([0], np.int64)
    msg = np.zeros([2 + bsz + bsz * T], np.int64)
    msg[0] = MSG_ID if flat(not_need_stop)[0] else -MSG_ID
    msg[1] = bsz
    n_v, dec_v, pl_v, pre_v = flat(accept_num), flat(seq_lens_decoder), flat(prompt_lens), flat(preempted_idx)
    for j in range(bsz):
        if pre_v[j] != 0:  # rule 1: reported exactly once
            c = PREEMPTED_TOKEN_ID
            pre_v[j] = 0
        elif skip_prefill and int(dec_v[j]) < int(pl_v[j]):  # rule 2: unfinished prefill chunk is hidden
            c = 0
        else:  # rule 3
            c = int(n_v[j])
        msg[2 + j] = c
        if c > 0:
            k = min(c, T)
            start = 2 + bsz + j * T
            msg[start:start + k] = accept_tokens[j, :k]
    return msg
