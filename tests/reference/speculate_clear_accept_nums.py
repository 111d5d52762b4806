"""Reference of `speculate_clear_accept_nums` (OPS §5.6): zero `accept_num` of slots without valid KV."""

from .checks import INT32, ArgChecker, flat

OP = "speculate_clear_accept_nums"
ARG_NAMES = ("accept_num", "seq_lens_decoder")


def check(accept_num, seq_lens_decoder):
    chk = ArgChecker(OP)
    B = chk.vector_len("accept_num", accept_num, INT32)
    if B < 1:
        chk.fail("accept_num", "expected at least 1 element (got 0)")
    chk.per_slot("seq_lens_decoder", seq_lens_decoder, INT32, B)
    chk.no_shared_storage(list(zip(ARG_NAMES, (accept_num, seq_lens_decoder))))


def speculate_clear_accept_nums(accept_num,         # [B] / [B,1] int32, in-place
                                seq_lens_decoder):  # [B] / [B,1] int32, read
    check(accept_num, seq_lens_decoder)
    n_v = flat(accept_num)
    n_v[flat(seq_lens_decoder) == 0] = 0
