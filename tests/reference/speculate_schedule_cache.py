"""Reference of `speculate_schedule_cache` (OPS §5.4): end-of-step stopping and block-step parking."""

from .checks import BOOL, INT32, INT64, ArgChecker, flat

OP = "speculate_schedule_cache"
ARG_NAMES = ("draft_tokens", "block_tables", "stop_flags", "prompt_lens", "seq_lens_this_time", "seq_lens_encoder",
             "seq_lens_decoder", "step_seq_lens_decoder", "step_draft_tokens", "step_seq_lens_this_time",
             "accept_num", "accept_tokens", "is_block_step", "not_need_stop")


def check(draft_tokens, block_tables, stop_flags, prompt_lens, seq_lens_this_time, seq_lens_encoder,
          seq_lens_decoder, step_seq_lens_decoder, step_draft_tokens, step_seq_lens_this_time, accept_num,
          accept_tokens, is_block_step, not_need_stop, block_size, max_draft_tokens, prefill_one_step_stop):
    chk = ArgChecker(OP)
    B = stop_flags.size  # checked in its own argument position below
    T = chk.matrix("draft_tokens", draft_tokens, INT64, B)
    NB = chk.matrix("block_tables", block_tables, INT32, B)
    chk.per_slot("stop_flags", stop_flags, BOOL, B)
    chk.per_slot("prompt_lens", prompt_lens, INT64, B)
    R = chk.vector_len("seq_lens_this_time", seq_lens_this_time, INT32)
    chk.real_bsz("seq_lens_this_time", R, B)
    chk.per_slot("seq_lens_encoder", seq_lens_encoder, INT32, B)
    chk.per_slot("seq_lens_decoder", seq_lens_decoder, INT32, B)
    chk.per_slot("step_seq_lens_decoder", step_seq_lens_decoder, INT32, B)
    chk.matrix("step_draft_tokens", step_draft_tokens, INT64, B, T)
    chk.per_slot("step_seq_lens_this_time", step_seq_lens_this_time, INT32, B)
    chk.per_slot("accept_num", accept_num, INT32, B)
    chk.matrix("accept_tokens", accept_tokens, INT64, B, T)
    chk.per_slot("is_block_step", is_block_step, BOOL, B)
    chk.array("not_need_stop", not_need_stop, BOOL)
    if not_need_stop.size != 1:
        chk.fail("not_need_stop", f"expected exactly 1 element (got {not_need_stop.size})")
    chk.int_attr("block_size", block_size, 1)
    chk.int_attr("max_draft_tokens", max_draft_tokens, 0)
    chk.bool_attr("prefill_one_step_stop", prefill_one_step_stop)
    chk.no_shared_storage(list(zip(ARG_NAMES, (
        draft_tokens, block_tables, stop_flags, prompt_lens, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder,
        step_seq_lens_decoder, step_draft_tokens, step_seq_lens_this_time, accept_num, accept_tokens,
        is_block_step, not_need_stop))))
    return B, R, T, NB


def speculate_schedule_cache(draft_tokens,             # [B, T] int64, read
                             block_tables,             # [B, NB] int32, read
                             stop_flags,               # [B] / [B,1] bool, in-place
                             prompt_lens,              # [B] / [B,1] int64, read
                             seq_lens_this_time,       # [R] / [R,1] int32, in-place
                             seq_lens_encoder,         # [B] / [B,1] int32, in-place
                             seq_lens_decoder,         # [B] / [B,1] int32, in-place
                             step_seq_lens_decoder,    # [B] / [B,1] int32, in-place
                             step_draft_tokens,        # [B, T] int64, in-place
                             step_seq_lens_this_time,  # [B] / [B,1] int32, in-place
                             accept_num,               # [B] / [B,1] int32, in-place
                             accept_tokens,            # [B, T] int64, in-place
                             is_block_step,            # [B] / [B,1] bool, in-place
                             not_need_stop,            # [1] bool (host), written
                             block_size, max_draft_tokens, prefill_one_step_stop):
    B, R, T, NB = check(draft_tokens, block_tables, stop_flags, prompt_lens, seq_lens_this_time, seq_lens_encoder,
                        seq_lens_decoder, step_seq_lens_decoder, step_draft_tokens, step_seq_lens_this_time,
                        accept_num, accept_tokens, is_block_step, not_need_stop, block_size, max_draft_tokens,
                        prefill_one_step_stop)
    stop_v, pl_v, stlt_v = flat(stop_flags), flat(prompt_lens), flat(seq_lens_this_time)
    enc_v, dec_v, sdec_v = flat(seq_lens_encoder), flat(seq_lens_decoder), flat(step_seq_lens_decoder)
    sstlt_v, n_v, blk_v = flat(step_seq_lens_this_time), flat(accept_num), flat(is_block_step)
    lookahead = 2 * max_draft_tokens + 2  # max_next_step_tokens

    for b in range(R):  # row Pad: b >= R is neither read nor written (counted below)
        if stop_v[b]:
            continue  # row Stp
        dec = int(dec_v[b])
        if dec < int(pl_v[b]) or prefill_one_step_stop:  # rows Pre and One
            stop_v[b] = True
            stlt_v[b] = 0
            dec_v[b] = 0
            enc_v[b] = 0
            n_v[b] = 0
            continue
        idx = max(dec + lookahead, 0) // block_size
        if idx < NB and block_tables[b, idx] == -1:  # row Park; idx >= NB keeps running (row Run)
            blk_v[b] = True
            sstlt_v[b] = stlt_v[b]
            stlt_v[b] = 0
            stop_v[b] = True
            sdec_v[b] = dec_v[b]
            dec_v[b] = 0
            n_v[b] = 0
            accept_tokens[b, :] = -1
            step_draft_tokens[b, :] = draft_tokens[b, :]

    stopped = (B - R) + int(stop_v[:R].sum())
    flat(not_need_stop)[0] = stopped < B
