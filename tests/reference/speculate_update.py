"""Reference of `speculate_update` (OPS §5.1): fold this step's verify results into the per-slot sequence state."""

from .checks import BOOL, INT32, INT64, ArgChecker, flat

OP = "speculate_update"
MAX_SLOTS = 512  # OPS §5.1 precondition 5: B <= 512 on every backend

ARG_NAMES = ("seq_lens_encoder", "seq_lens_decoder", "not_need_stop", "draft_tokens", "actual_draft_token_nums",
             "accept_tokens", "accept_num", "stop_flags", "seq_lens_this_time", "is_block_step", "mask_rollback")


def check(seq_lens_encoder, seq_lens_decoder, not_need_stop, draft_tokens, actual_draft_token_nums,
          accept_tokens, accept_num, stop_flags, seq_lens_this_time, is_block_step, mask_rollback):
    chk = ArgChecker(OP)
    B = stop_flags.size  # checked in its own argument position below
    chk.per_slot("seq_lens_encoder", seq_lens_encoder, INT32, B)
    chk.per_slot("seq_lens_decoder", seq_lens_decoder, INT32, B)
    chk.array("not_need_stop", not_need_stop, BOOL)
    if not_need_stop.size != 1:
        chk.fail("not_need_stop", f"expected exactly 1 element (got {not_need_stop.size})")
    T = chk.matrix("draft_tokens", draft_tokens, INT64, B)
    chk.per_slot("actual_draft_token_nums", actual_draft_token_nums, INT32, B)
    chk.matrix("accept_tokens", accept_tokens, INT64, B, T)
    chk.per_slot("accept_num", accept_num, INT32, B)
    chk.per_slot("stop_flags", stop_flags, BOOL, B)
    R = chk.vector_len("seq_lens_this_time", seq_lens_this_time, INT32)
    chk.real_bsz("seq_lens_this_time", R, B)
    chk.per_slot("is_block_step", is_block_step, BOOL, B)
    chk.per_slot("mask_rollback", mask_rollback, INT32, B)
    if B > MAX_SLOTS:
        chk.fail("stop_flags", f"{B} slots exceeds the supported maximum of {MAX_SLOTS}")
    chk.no_shared_storage(list(zip(ARG_NAMES, (
        seq_lens_encoder, seq_lens_decoder, not_need_stop, draft_tokens, actual_draft_token_nums,
        accept_tokens, accept_num, stop_flags, seq_lens_this_time, is_block_step, mask_rollback))))
    return B, R, T



def speculate_update(seq_lens_encoder,         # [B] / [B,1] int32, in-place
                     seq_lens_decoder,         # [B] / [B,1] int32, in-place
                     not_need_stop,            # [1] bool (host), written
                     draft_tokens,             # [B, T] int64, column 0 written
                     actual_draft_token_nums,  # [B] / [B,1] int32, in-place
                     accept_tokens,            # [B, T] int64, read
                     accept_num,               # [B] / [B,1] int32, read
                     stop_flags,               # [B] / [B,1] bool, read
                     seq_lens_this_time,       # [R] / [R,1] int32, read
                     is_block_step,            # [B] / [B,1] bool, read
                     mask_rollback):           # [B] / [B,1] int32, written
    B, R, T = check(seq_lens_encoder, seq_lens_decoder, not_need_stop, draft_tokens, actual_draft_token_nums,
                    accept_tokens, accept_num, stop_flags, seq_lens_this_time, is_block_step, mask_rollback)
    enc_v, dec_v, adn_v = flat(seq_lens_encoder), flat(seq_lens_decoder), flat(actual_draft_token_nums)
    n_v, stop_v, stlt_v = flat(accept_num), flat(stop_flags), flat(seq_lens_this_time)
    blk_v, mr_v = flat(is_block_step), flat(mask_rollback)

    stopped = B - R  # row A: padding slots count as stopped and are never read
    for b in range(R):
        if blk_v[b]:
            continue  # row B: parked, not counted
        n, enc, dec, stlt = int(n_v[b]), int(enc_v[b]), int(dec_v[b]), int(stlt_v[b])
        if stop_v[b]:  # row C: a stopped slot still accounts for its accepted tokens (PD_MTP_FLOW §8)
            dec += n
            mr_v[b] = 0
            stopped += 1
        elif enc == 0:  # row D: decode slot
            dec += n
            mr_v[b] = stlt - n
        else:  # row E: prefill slot
            mr_v[b] = 0

        if stlt > 1 and enc == 0:  # step 1: adaptive draft length
            cur = int(adn_v[b])
            if n - 1 == cur:
                adn_v[b] = cur + 2 if cur + 2 <= T - 1 else (cur + 1 if cur + 1 <= T - 1 else T - 1)
            else:
                adn_v[b] = max(cur - 1, 1)
        if enc != 0:  # step 2: prefill folding
            dec += enc
            enc_v[b] = 0
        dec_v[b] = dec
        if 1 <= n <= T:  # step 3: seed token; n == 0 must not read accept_tokens[b, -1] (defect D5)
            draft_tokens[b, 0] = accept_tokens[b, n - 1]

    flat(not_need_stop)[0] = stopped < B
