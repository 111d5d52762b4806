"""Reference of `speculate_set_stop_value_multi_seqs` (OPS §5.3): per-request stop-sequence matching over the
accepted run and the generated history."""

from .checks import BOOL, INT32, INT64, ArgChecker, flat

OP = "speculate_set_stop_value_multi_seqs"
ARG_NAMES = ("accept_tokens", "accept_num", "pre_ids", "step_idx", "stop_flags", "seq_lens", "stop_seqs",
             "stop_seqs_len", "end_ids", "min_tokens")


def check(accept_tokens, accept_num, pre_ids, step_idx, stop_flags, seq_lens, stop_seqs, stop_seqs_len, end_ids,
          min_tokens):
    chk = ArgChecker(OP)
    B = stop_flags.size  # checked in its own argument position below
    T = chk.matrix("accept_tokens", accept_tokens, INT64, B)
    chk.per_slot("accept_num", accept_num, INT32, B)
    M = chk.matrix("pre_ids", pre_ids, INT64, B)
    chk.per_slot("step_idx", step_idx, INT64, B)
    chk.per_slot("stop_flags", stop_flags, BOOL, B)
    R = chk.vector_len("seq_lens", seq_lens, INT32)
    chk.real_bsz("seq_lens", R, B)
    chk.array("stop_seqs", stop_seqs, INT64)
    if stop_seqs.ndim != 3 or stop_seqs.shape[0] != B or stop_seqs.shape[1] < 1 or stop_seqs.shape[2] < 1:
        chk.fail("stop_seqs", f"expected shape [{B}, S >= 1, SL >= 1] (got {list(stop_seqs.shape)})")
    S, SL = stop_seqs.shape[1], stop_seqs.shape[2]
    chk.matrix("stop_seqs_len", stop_seqs_len, INT32, B, S)
    E = chk.vector_len("end_ids", end_ids, INT64)
    if E < 1:
        chk.fail("end_ids", "expected at least 1 element (got 0)")
    chk.per_slot("min_tokens", min_tokens, INT64, B)
    chk.no_shared_storage(list(zip(ARG_NAMES, (accept_tokens, accept_num, pre_ids, step_idx, stop_flags, seq_lens,
                                               stop_seqs, stop_seqs_len, end_ids, min_tokens))))
    return B, R, T, M, S, SL


def _matches(accept_row, pre_row, seq, length, s, n, a) -> bool:
    """Whether stop sequence `seq[:length]` ends immediately before accept position `a` (OPS §5.3 match test)."""
    M, SL = pre_row.shape[0], seq.shape[0]
    if length <= 0 or length > SL:
        return False  # unused entry / out-of-domain guard
    if s - n + a + 1 < length:
        return False  # not enough generated history
    for k in range(length):  # backwards: k = 0 is the last element of the stop sequence
        expected = int(seq[length - 1 - k])
        p = a - 1 - k
        if p >= 0:
            actual = int(accept_row[p])
        else:
            m = s - n + a - k
            if m <= 0 or m >= M:
                return False  # generated token 0 is reserved; never outside the row
            actual = int(pre_row[m])
        if actual != expected:
            return False
    return True


def speculate_set_stop_value_multi_seqs(accept_tokens,  # [B, T] int64, in-place
                                        accept_num,     # [B] / [B,1] int32, in-place
                                        pre_ids,        # [B, M] int64, read
                                        step_idx,       # [B] / [B,1] int64, read
                                        stop_flags,     # [B] / [B,1] bool, in-place
                                        seq_lens,       # [R] / [R,1] int32, length only
                                        stop_seqs,      # [B, S, SL] int64, read
                                        stop_seqs_len,  # [B, S] int32, read
                                        end_ids,        # [E] / [E,1] int64, element 0 read
                                        min_tokens):    # [B] / [B,1] int64, read
    B, R, T, M, S, SL = check(accept_tokens, accept_num, pre_ids, step_idx, stop_flags, seq_lens, stop_seqs,
                              stop_seqs_len, end_ids, min_tokens)
    n_v, s_v, stop_v, min_v = flat(accept_num), flat(step_idx), flat(stop_flags), flat(min_tokens)
    for b in range(R):  # slots b >= R are untouched
        s, n = int(s_v[b]), int(n_v[b])
        if n <= 0:
            continue  # nothing produced this step; slots stopped by verify in this step (n >= 1) ARE scanned
        for a in range(min(n, T)):  # position-major: the earliest matching position wins
            if s - n + a + 1 < int(min_v[b]):
                continue  # per-position min_tokens gate (PD_MTP_FLOW §10.2)
            if any(_matches(accept_tokens[b], pre_ids[b], stop_seqs[b, t], int(stop_seqs_len[b, t]), s, n, a)
                   for t in range(S)):
                n_v[b] = a + 1
                accept_tokens[b, a] = flat(end_ids)[0]
                stop_v[b] = True
                break
