"""Reference of `recover_decode_task` (OPS §5.5): resume parked slots whose next KV block now exists."""

from .checks import BOOL, INT32, INT64, ArgChecker, flat

OP = "recover_decode_task"
ARG_NAMES = ("stop_flags", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder", "step_seq_lens_decoder",
             "block_tables", "is_block_step", "draft_tokens", "step_draft_tokens", "step_seq_lens_this_time")
OPTIONAL_NAMES = ARG_NAMES[7:]


def check(stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, step_seq_lens_decoder, block_tables,
          is_block_step, draft_tokens, step_draft_tokens, step_seq_lens_this_time, block_size, max_draft_tokens):
    chk = ArgChecker(OP)
    optional = (draft_tokens, step_draft_tokens, step_seq_lens_this_time)
    speculative = any(t is not None for t in optional)
    if speculative:
        for name, t in zip(OPTIONAL_NAMES, optional):
            if t is None:
                chk.fail(name, "is None while other speculative tensors are given (all three or none)")
    B = stop_flags.size  # checked in its own argument position below
    chk.per_slot("stop_flags", stop_flags, BOOL, B)
    R = chk.vector_len("seq_lens_this_time", seq_lens_this_time, INT32)
    chk.real_bsz("seq_lens_this_time", R, B)
    chk.per_slot("seq_lens_encoder", seq_lens_encoder, INT32, B)
    chk.per_slot("seq_lens_decoder", seq_lens_decoder, INT32, B)
    chk.per_slot("step_seq_lens_decoder", step_seq_lens_decoder, INT32, B)
    NB = chk.matrix("block_tables", block_tables, INT32, B)
    chk.per_slot("is_block_step", is_block_step, BOOL, B)
    T = 0
    if speculative:
        T = chk.matrix("draft_tokens", draft_tokens, INT64, B)
        chk.matrix("step_draft_tokens", step_draft_tokens, INT64, B, T)
        chk.per_slot("step_seq_lens_this_time", step_seq_lens_this_time, INT32, B)
    chk.int_attr("block_size", block_size, 1)
    chk.int_attr("max_draft_tokens", max_draft_tokens, 0)
    tensors = (stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, step_seq_lens_decoder,
               block_tables, is_block_step) + (optional if speculative else ())
    chk.no_shared_storage(list(zip(ARG_NAMES, tensors)))
    return B, R, NB, T, speculative


def recover_decode_task(stop_flags,                    # [B] / [B,1] bool, in-place
                        seq_lens_this_time,            # [R] / [R,1] int32, in-place
                        seq_lens_encoder,              # [B] / [B,1] int32, in-place
                        seq_lens_decoder,              # [B] / [B,1] int32, in-place
                        step_seq_lens_decoder,         # [B] / [B,1] int32, read
                        block_tables,                  # [B, NB] int32, read
                        is_block_step,                 # [B] / [B,1] bool, in-place
                        draft_tokens,                  # [B, T] int64 or None, in-place
                        step_draft_tokens,             # [B, T] int64 or None, read
                        step_seq_lens_this_time,       # [B] / [B,1] int32 or None, read
                        block_size, max_draft_tokens):
    B, R, NB, T, speculative = check(stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder,
                                     step_seq_lens_decoder, block_tables, is_block_step, draft_tokens,
                                     step_draft_tokens, step_seq_lens_this_time, block_size, max_draft_tokens)
    stop_v, stlt_v, enc_v = flat(stop_flags), flat(seq_lens_this_time), flat(seq_lens_encoder)
    dec_v, sdec_v, blk_v = flat(seq_lens_decoder), flat(step_seq_lens_decoder), flat(is_block_step)
    extra = 2 * max_draft_tokens + 1 if speculative else 0
    for b in range(R):
        if not blk_v[b]:
            continue
        # clamped to the last column of the slot's own row: the next row is never read (defect D7)
        idx = min(max(int(sdec_v[b]) + extra, 0) // block_size, NB - 1)
        if block_tables[b, idx] == -1:
            continue
        blk_v[b] = False
        stop_v[b] = False
        enc_v[b] = 0
        dec_v[b] = sdec_v[b]
        if speculative:
            stlt = int(flat(step_seq_lens_this_time)[b])
            stlt_v[b] = stlt
            ncopy = min(max(stlt, 0), T)
            draft_tokens[b, :ncopy] = step_draft_tokens[b, :ncopy]
        else:
            stlt_v[b] = 1
