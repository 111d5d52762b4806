"""Seeded generators of random in-domain inputs for every reference op (OPS §8 C1).

`gen_inputs(op, seed, B, R, T, ...)` returns an `OpCase`: the op's tensors as NumPy arrays in OPS argument order
plus its attributes. Values stay inside each op's value domain (OPS §2.4) for the slots the op reads; slots the op
must not read (padding, parked slots where the spec says their values are unused) get out-of-domain garbage, so a
backend that reads them shows up as a parity failure. Token values mix a tiny vocabulary (so stop sequences match
often) with values >= 2^31 (so int64 truncation shows up). `run_reference(case)` runs the matching reference op on a
copy of a case.
"""

from dataclasses import dataclass, field

import numpy as np

from . import (recover_decode_task, speculate_clear_accept_nums, speculate_save_output, speculate_schedule_cache,
               speculate_set_stop_value_multi_seqs, speculate_set_value_by_flags_and_idx, speculate_update)

I32, I64 = np.int32, np.int64
BIG_TOKEN = 1 << 40


@dataclass
class OpCase:
    op: str
    tensors: dict[str, np.ndarray | None]  # OPS argument order
    attrs: dict[str, object] = field(default_factory=dict)

    def copy(self) -> "OpCase":
        return OpCase(self.op, {k: None if v is None else v.copy() for k, v in self.tensors.items()},
                      dict(self.attrs))


def _slot_vec(rng, values, dtype) -> np.ndarray:
    """A per-slot vector, randomly shaped [N] or [N, 1] (both are accepted, OPS §1)."""
    a = np.ascontiguousarray(values, dtype=dtype)
    return a.reshape(-1, 1) if rng.random() < 0.5 else a.reshape(-1)


def _tokens(rng, shape) -> np.ndarray:
    """Mostly tokens from a 4-word vocabulary, some large ones (>= 2^31)."""
    small = rng.integers(0, 4, size=shape)
    big = rng.integers(1 << 31, BIG_TOKEN, size=shape)
    return np.where(rng.random(shape) < 0.15, big, small).astype(I64)


def _garbage_i32(rng, n) -> np.ndarray:
    return rng.integers(-(1 << 31), 1 << 31, size=n, dtype=np.int64).astype(I32)


def gen_speculate_update(rng, B, R, T) -> OpCase:
    stop = rng.random(B) < 0.3
    blk = rng.random(B) < 0.15
    enc = np.where(rng.random(B) < 0.6, 0, rng.integers(1, 2048, B))
    dec = rng.integers(0, 1 << 16, B)
    stlt = np.where(enc > 0, enc, rng.integers(0, T + 1, B))
    adn = rng.integers(1, T + 2, B)
    n = rng.integers(0, T + 1, B)
    all_accepted = (rng.random(B) < 0.35) & (adn + 1 <= T)  # hit the "every draft accepted" branch often
    n = np.where(all_accepted, adn + 1, n)
    unused = np.arange(B) >= R  # row A; row B slots keep in-domain values except n (still unused)
    n = np.where(unused | blk, rng.integers(-5, T + 6, B), n)
    enc = np.where(unused, _garbage_i32(rng, B), enc)
    dec = np.where(unused, _garbage_i32(rng, B), dec)
    return OpCase("speculate_update", {
        "seq_lens_encoder": _slot_vec(rng, enc, I32),
        "seq_lens_decoder": _slot_vec(rng, dec, I32),
        "not_need_stop": np.array([rng.random() < 0.5]),
        "draft_tokens": _tokens(rng, (B, T)),
        "actual_draft_token_nums": _slot_vec(rng, adn, I32),
        "accept_tokens": _tokens(rng, (B, T)),
        "accept_num": _slot_vec(rng, n, I32),
        "stop_flags": _slot_vec(rng, stop, np.bool_),
        "seq_lens_this_time": _slot_vec(rng, stlt[:R], I32),
        "is_block_step": _slot_vec(rng, blk, np.bool_),
        "mask_rollback": _slot_vec(rng, rng.integers(-100, 100, B), I32),
    })


def gen_speculate_set_value_by_flags_and_idx(rng, B, R, T, M=None) -> OpCase:
    M = M or int(rng.integers(1, 3 * T + 8))
    n = rng.integers(0, T + 1, B)
    s = np.where(rng.random(B) < 0.3, rng.integers(0, min(T, M), B), rng.integers(0, M, B))  # s < T-1 often (D6)
    return OpCase("speculate_set_value_by_flags_and_idx", {
        "pre_ids_all": _tokens(rng, (B, M)),
        "accept_tokens": _tokens(rng, (B, T)),
        "accept_num": _slot_vec(rng, n, I32),
        "stop_flags": _slot_vec(rng, rng.random(B) < 0.3, np.bool_),
        "seq_lens_this_time": _slot_vec(rng, _garbage_i32(rng, R), I32),  # length only
        "seq_lens_encoder": _slot_vec(rng, np.where(rng.random(B) < 0.7, 0, rng.integers(1, 100, B)), I32),
        "seq_lens_decoder": _slot_vec(rng, np.where(rng.random(B) < 0.3, 0, rng.integers(1, 1000, B)), I32),
        "step_idx": _slot_vec(rng, s, I64),
    })


def gen_speculate_set_stop_value_multi_seqs(rng, B, R, T, M=None, S=None, SL=None) -> OpCase:
    M = M or int(rng.integers(T + 1, T + 24))
    S = S or int(rng.integers(1, 4))
    SL = SL or int(rng.integers(1, 6))
    n = rng.integers(0, T + 1, B)
    s = np.array([rng.integers(k, M) for k in n], dtype=I64)  # n <= s < M
    accept = _tokens(rng, (B, T))
    pre = _tokens(rng, (B, M))
    stop_seqs = _tokens(rng, (B, S, SL))
    stop_len = rng.integers(0, SL + 1, (B, S)).astype(I32)
    for b in range(B):  # plant some stop sequences copied from the slot's generated stream 1..s
        stream = np.concatenate([pre[b, 1:s[b] - n[b] + 1], accept[b, :n[b]]])
        for t in range(S):
            length = int(stop_len[b, t])
            if length and len(stream) >= length and rng.random() < 0.5:
                end = int(rng.integers(length, len(stream) + 1))
                stop_seqs[b, t, :length] = stream[end - length:end]
    min_tokens = np.where(rng.random(B) < 0.5, 0, rng.integers(0, M + 2, B))
    return OpCase("speculate_set_stop_value_multi_seqs", {
        "accept_tokens": accept,
        "accept_num": _slot_vec(rng, n, I32),
        "pre_ids": pre,
        "step_idx": _slot_vec(rng, s, I64),
        "stop_flags": _slot_vec(rng, rng.random(B) < 0.3, np.bool_),
        "seq_lens": _slot_vec(rng, _garbage_i32(rng, R), I32),  # length only
        "stop_seqs": stop_seqs,
        "stop_seqs_len": stop_len,
        "end_ids": _slot_vec(rng, _tokens(rng, int(rng.integers(1, 4))), I64),
        "min_tokens": _slot_vec(rng, min_tokens, I64),
    })


def gen_speculate_schedule_cache(rng, B, R, T, NB=None) -> OpCase:
    NB = NB or int(rng.integers(1, 12))
    block_size = int(rng.choice([1, 2, 4, 16, 64]))
    K = int(rng.integers(0, 8))
    dec = rng.integers(0, (NB + 1) * block_size + 1, B)
    prompt = dec + rng.integers(-40, 3, B)
    prompt = np.where(rng.random(B) < 0.05, (1 << 33) + prompt, prompt)  # int64 comparison
    tables = np.where(rng.random((B, NB)) < 0.4, -1, rng.integers(0, 1 << 20, (B, NB))).astype(I32)
    unused = np.arange(B) >= R
    dec = np.where(unused, _garbage_i32(rng, B), dec)
    return OpCase("speculate_schedule_cache", {
        "draft_tokens": _tokens(rng, (B, T)),
        "block_tables": tables,
        "stop_flags": _slot_vec(rng, rng.random(B) < 0.3, np.bool_),
        "prompt_lens": _slot_vec(rng, prompt, I64),
        "seq_lens_this_time": _slot_vec(rng, rng.integers(0, T + 1, R), I32),
        "seq_lens_encoder": _slot_vec(rng, rng.integers(0, 64, B), I32),
        "seq_lens_decoder": _slot_vec(rng, dec, I32),
        "step_seq_lens_decoder": _slot_vec(rng, rng.integers(0, 100, B), I32),
        "step_draft_tokens": _tokens(rng, (B, T)),
        "step_seq_lens_this_time": _slot_vec(rng, rng.integers(0, T + 1, B), I32),
        "accept_num": _slot_vec(rng, rng.integers(0, T + 1, B), I32),
        "accept_tokens": _tokens(rng, (B, T)),
        "is_block_step": _slot_vec(rng, rng.random(B) < 0.1, np.bool_),
        "not_need_stop": np.array([rng.random() < 0.5]),
    }, {"block_size": block_size, "max_draft_tokens": K, "prefill_one_step_stop": bool(rng.random() < 0.2)})


def gen_recover_decode_task(rng, B, R, T, NB=None, speculative=None) -> OpCase:
    NB = NB or int(rng.integers(1, 12))
    block_size = int(rng.choice([1, 2, 4, 16, 64]))
    K = int(rng.integers(0, 8))
    speculative = bool(rng.random() < 0.7) if speculative is None else speculative
    tables = np.where(rng.random((B, NB)) < 0.5, -1, rng.integers(0, 1 << 20, (B, NB))).astype(I32)
    sdec = rng.integers(0, (NB + 2) * block_size, B)  # idx beyond NB - 1 is clamped
    opt = {"draft_tokens": None, "step_draft_tokens": None, "step_seq_lens_this_time": None}
    if speculative:
        opt = {"draft_tokens": _tokens(rng, (B, T)),
               "step_draft_tokens": _tokens(rng, (B, T)),
               "step_seq_lens_this_time": _slot_vec(rng, rng.integers(0, T + 1, B), I32)}
    return OpCase("recover_decode_task", {
        "stop_flags": _slot_vec(rng, rng.random(B) < 0.6, np.bool_),
        "seq_lens_this_time": _slot_vec(rng, rng.integers(0, T + 1, R), I32),
        "seq_lens_encoder": _slot_vec(rng, rng.integers(0, 64, B), I32),
        "seq_lens_decoder": _slot_vec(rng, rng.integers(0, 1000, B), I32),
        "step_seq_lens_decoder": _slot_vec(rng, sdec, I32),
        "block_tables": tables,
        "is_block_step": _slot_vec(rng, rng.random(B) < 0.5, np.bool_),
        **opt,
    }, {"block_size": block_size, "max_draft_tokens": K})


def gen_speculate_clear_accept_nums(rng, B, R, T) -> OpCase:
    return OpCase("speculate_clear_accept_nums", {
        "accept_num": _slot_vec(rng, rng.integers(0, T + 1, B), I32),
        "seq_lens_decoder": _slot_vec(rng, np.where(rng.random(B) < 0.4, 0, rng.integers(1, 1000, B)), I32),
    })


def gen_speculate_save_output(rng, B, R, T) -> OpCase:
    n = np.where(rng.random(B) < 0.05, -3, rng.integers(0, T + 1, B))  # RECOVERY_STOP passes through
    dec = rng.integers(0, 1000, B)
    prompt = dec + rng.integers(-20, 3, B)
    return OpCase("speculate_save_output", {
        "accept_tokens": _tokens(rng, (B, T)),
        "accept_num": _slot_vec(rng, n, I32),
        "not_need_stop": np.array([rng.random() < 0.5]),
        "seq_lens_decoder": _slot_vec(rng, dec, I32),
        "prompt_lens": _slot_vec(rng, prompt, I64),
        "preempted_idx": _slot_vec(rng, rng.random(B) < 0.1, I32),
    }, {"rank_id": int(rng.choice([0, 0, 0, 1, 3])), "save_each_rank": bool(rng.random() < 0.5),
        "skip_prefill": bool(rng.random() < 0.8)})


GENERATORS = {
    "speculate_update": gen_speculate_update,
    "speculate_set_value_by_flags_and_idx": gen_speculate_set_value_by_flags_and_idx,
    "speculate_set_stop_value_multi_seqs": gen_speculate_set_stop_value_multi_seqs,
    "speculate_schedule_cache": gen_speculate_schedule_cache,
    "recover_decode_task": gen_recover_decode_task,
    "speculate_clear_accept_nums": gen_speculate_clear_accept_nums,
    "speculate_save_output": gen_speculate_save_output,
}

REFERENCES = {
    "speculate_update": speculate_update,
    "speculate_set_value_by_flags_and_idx": speculate_set_value_by_flags_and_idx,
    "speculate_set_stop_value_multi_seqs": speculate_set_stop_value_multi_seqs,
    "speculate_schedule_cache": speculate_schedule_cache,
    "recover_decode_task": recover_decode_task,
    "speculate_clear_accept_nums": speculate_clear_accept_nums,
    "speculate_save_output": speculate_save_output,
}


def gen_inputs(op: str, seed: int, B: int, R: int, T: int, **dims) -> OpCase:
    """Random in-domain inputs for `op` with B slots, R = real_bsz (1 <= R <= B) and row width T."""
    return GENERATORS[op](np.random.default_rng(seed), B, R, T, **dims)


def run_reference(case: OpCase):
    """Runs the reference on a copy of `case`; returns (tensors after the call, op result)."""
    after = case.copy()
    result = REFERENCES[case.op](*after.tensors.values(), *after.attrs.values())
    return after.tensors, result
