"""The per-slot state tensors of OPS §3, allocated once for B slots and shared by runner, ops and proposer.

Each field is a host NumPy array; `views` holds a Paddle tensor over the same memory (DLPack, zero copy) for
every field, which is what the ops receive. Python-side writes (insertion, verify) therefore go through NumPy
without a per-element tensor op, and the ops' in-place results are visible in NumPy at once. Per-slot vectors
are allocated as [B] (OPS §1 accepts [B] and [B, 1] alike).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from types import SimpleNamespace

import numpy as np

UNALLOCATED_BLOCK = -1


@dataclass(slots=True)
class ShareInputs:
    seq_lens_this_time: np.ndarray       # [B] int32
    seq_lens_encoder: np.ndarray         # [B] int32
    seq_lens_decoder: np.ndarray         # [B] int32
    step_idx: np.ndarray                 # [B] int64
    stop_flags: np.ndarray               # [B] bool, true = idle/finished/parked
    not_need_stop: np.ndarray            # [1] bool (host)
    draft_tokens: np.ndarray             # [B, T] int64
    accept_tokens: np.ndarray            # [B, T] int64
    accept_num: np.ndarray               # [B] int32
    actual_draft_token_num: np.ndarray   # [B] int32
    is_block_step: np.ndarray            # [B] bool
    mask_rollback: np.ndarray            # [B] int32
    pre_ids: np.ndarray                  # [B, M] int64
    prompt_lens: np.ndarray              # [B] int64
    min_dec_len: np.ndarray              # [B] int64
    max_dec_len: np.ndarray              # [B] int64
    stop_seqs: np.ndarray                # [B, S, SL] int64
    stop_seqs_len: np.ndarray            # [B, S] int32
    eos_token_id: np.ndarray             # [E] int64
    block_tables: np.ndarray             # [B, NB] int32
    step_seq_lens_decoder: np.ndarray    # [B] int32
    step_seq_lens_this_time: np.ndarray  # [B] int32
    step_draft_tokens: np.ndarray        # [B, T] int64
    preempted_idx: np.ndarray            # [B] int32 (host)
    input_ids: np.ndarray                # [B, M] int64
    views: SimpleNamespace | None = None  # a Paddle tensor per field above, same memory

    @classmethod
    def allocate(cls, num_slots: int, k: int, max_model_len: int, blocks_per_seq: int, max_stop_seqs: int,
                 max_stop_seq_len: int, eos_token_ids: tuple[int, ...]) -> ShareInputs:
        """Initial values of OPS §3; T = K + 1, M = max_model_len."""
        B, T, M = num_slots, k + 1, max_model_len

        def full(shape, value, dtype):
            return np.full(shape, value, dtype=dtype)

        return cls(
            seq_lens_this_time=full(B, 0, np.int32), seq_lens_encoder=full(B, 0, np.int32),
            seq_lens_decoder=full(B, 0, np.int32), step_idx=full(B, 0, np.int64),
            stop_flags=full(B, True, np.bool_), not_need_stop=full(1, False, np.bool_),
            draft_tokens=full((B, T), 0, np.int64), accept_tokens=full((B, T), 0, np.int64),
            accept_num=full(B, 0, np.int32), actual_draft_token_num=full(B, k, np.int32),
            is_block_step=full(B, False, np.bool_), mask_rollback=full(B, 0, np.int32),
            pre_ids=full((B, M), -1, np.int64), prompt_lens=full(B, 0, np.int64),
            min_dec_len=full(B, 1, np.int64), max_dec_len=full(B, M, np.int64),
            stop_seqs=full((B, max_stop_seqs, max_stop_seq_len), -1, np.int64),
            stop_seqs_len=full((B, max_stop_seqs), 0, np.int32),
            eos_token_id=np.asarray(eos_token_ids, dtype=np.int64),
            block_tables=full((B, blocks_per_seq), UNALLOCATED_BLOCK, np.int32),
            step_seq_lens_decoder=full(B, 0, np.int32), step_seq_lens_this_time=full(B, 0, np.int32),
            step_draft_tokens=full((B, T), 0, np.int64), preempted_idx=full(B, 0, np.int32),
            input_ids=full((B, M), 0, np.int64))

    def attach_views(self, to_tensor: Callable[[np.ndarray], object]) -> None:
        self.views = SimpleNamespace(**{f.name: to_tensor(getattr(self, f.name))
                                        for f in fields(self) if f.name != "views"})
