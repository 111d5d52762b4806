"""Reference of `speculate_set_value_by_flags_and_idx` (OPS §5.2): clean up stopped slots, append accepted tokens
to `pre_ids`."""

from .checks import BOOL, INT32, INT64, ArgChecker, flat

OP = "speculate_set_value_by_flags_and_idx"
ARG_NAMES = ("pre_ids_all", "accept_tokens", "accept_num", "stop_flags", "seq_lens_this_time", "seq_lens_encoder",
             "seq_lens_decoder", "step_idx")


def check(pre_ids_all, accept_tokens, accept_num, stop_flags, seq_lens_this_time, seq_lens_encoder,
          seq_lens_decoder, step_idx):
    chk = ArgChecker(OP)
    B = stop_flags.size  # checked in its own argument position below
    M = chk.matrix("pre_ids_all", pre_ids_all, INT64, B)
    T = chk.matrix("accept_tokens", accept_tokens, INT64, B)
    chk.per_slot("accept_num", accept_num, INT32, B)
    chk.per_slot("stop_flags", stop_flags, BOOL, B)
    R = chk.vector_len("seq_lens_this_time", seq_lens_this_time, INT32)
    chk.real_bsz("seq_lens_this_time", R, B)
    chk.per_slot("seq_lens_encoder", seq_lens_encoder, INT32, B)
    chk.per_slot("seq_lens_decoder", seq_lens_decoder, INT32, B)
    chk.per_slot("step_idx", step_idx, INT64, B)
    chk.no_shared_storage(list(zip(ARG_NAMES, (pre_ids_all, accept_tokens, accept_num, stop_flags,
                                               seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, step_idx))))
    return B, R, M, T


def speculate_set_value_by_flags_and_idx(pre_ids_all,         # [B, M] int64, in-place
                                         accept_tokens,       # [B, T] int64, read
                                         accept_num,          # [B] / [B,1] int32, in-place
                                         stop_flags,          # [B] / [B,1] bool, read
                                         seq_lens_this_time,  # [R] / [R,1] int32, length only
                                         seq_lens_encoder,    # [B] / [B,1] int32, read
                                         seq_lens_decoder,    # [B] / [B,1] int32, in-place
                                         step_idx):           # [B] / [B,1] int64, read
    B, R, M, T = check(pre_ids_all, accept_tokens, accept_num, stop_flags, seq_lens_this_time, seq_lens_encoder,
                       seq_lens_decoder, step_idx)
    n_v, stop_v, enc_v = flat(accept_num), flat(stop_flags), flat(seq_lens_encoder)
    dec_v, s_v = flat(seq_lens_decoder), flat(step_idx)
    for b in range(R):  # slots b >= R are untouched
        if stop_v[b]:  # row S
            n_v[b] = 0
            dec_v[b] = 0
            continue
        if enc_v[b] == 0 and dec_v[b] == 0:  # row Z
            continue
        s, n = int(s_v[b]), int(n_v[b])  # row W
        if s <= 0:
            continue
        for a in range(max(0, min(n, T))):
            idx = s - (n - 1 - a)
            if 0 <= idx < M:  # per-element guard: never outside the slot's own row (defect D6)
                pre_ids_all[b, idx] = accept_tokens[b, a]
