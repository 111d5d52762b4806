"""Holds the runner's step state -- the per-slot tensors of OPS §3 (`ShareInputs`) plus the packed target-forward
input (`PackedStep`) -- in one module that the step ops, the runner and the proposer all import (no package
cycle).

Each state field is a host NumPy array; `views` holds the tensor the ops receive for every field, on the runner's
place. On the host place the views are zero-copy DLPack imports of the arrays, so Python-side writes (insertion,
verify) and the ops' in-place results are the same memory and the explicit copies `push()` / `pull()` return at
once; on a device place they copy. The host results of OPS §2.6 are read through `read_not_need_stop()` and
`to_host_message()` on every place. Per-slot vectors are allocated as [B] (OPS §1 accepts [B] and [B, 1] alike).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from types import SimpleNamespace

import numpy as np
import paddle

from fastdeploy.model_executor.models import ForwardBatch
from fastdeploy.model_executor.ops.step_message import UNALLOCATED_BLOCK


@dataclass(slots=True)
class PackedStep:
    """The target forward's input, one sequence per active slot in slot order."""

    batch: ForwardBatch
    slots: np.ndarray        # [S] int64, slot of each packed sequence
    is_prefill: np.ndarray   # [S] bool, the sequence is a prefill chunk (enc > 0)
    num_candidates: np.ndarray   # [S] int64, its last rows that choose tokens: every row of a decode round, the
                                 # last row of a chunk that completes the known tokens, none of any other chunk

    def rows(self, i: int) -> range:
        """Packed token rows (and logits/hidden rows) of sequence i."""
        return range(int(self.batch.seq_starts[i]), int(self.batch.seq_starts[i + 1]))


class StateViews(SimpleNamespace):
    """The ops' tensor of every state field, by name; `zero_copy` when they share memory with the NumPy fields."""

    def __init__(self, zero_copy: bool, **tensors):
        super().__init__(**tensors)
        self.zero_copy = zero_copy


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
    actual_draft_token_nums: np.ndarray   # [B] int32
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
    views: StateViews | None = None      # a Paddle tensor per field above, on the runner's place

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
            accept_num=full(B, 0, np.int32), actual_draft_token_nums=full(B, k, np.int32),
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

    def attach_views(self, to_device: Callable[[np.ndarray], object], zero_copy: bool) -> None:
        """Creates the tensors the ops receive: `to_device(array)` for device fields, a zero-copy host view for the
        host fields of OPS §2.2 (not_need_stop, preempted_idx) whatever the place. `zero_copy`: to_device's
        tensors share memory with the arrays (the host place), so push() and pull() have nothing to do."""
        self.views = StateViews(zero_copy, **{
            name: _host_view(getattr(self, name)) if name in HOST_FIELDS else to_device(getattr(self, name))
            for name in STATE_FIELDS})

    def push(self) -> None:
        """Explicit host -> device copy of the state after Python-side writes (insertion, verify, drafts)."""
        if self.views.zero_copy:
            return
        for name in DEVICE_FIELDS:
            getattr(self.views, name).set_value(getattr(self, name))

    def pull(self) -> None:
        """Explicit device -> host copy of the state before Python-side reads (packing, verify, drafting)."""
        if self.views.zero_copy:
            return
        for name in DEVICE_FIELDS:
            np.copyto(getattr(self, name), getattr(self.views, name).numpy())

    def read_not_need_stop(self) -> bool:
        """OPS §2.6: not_need_stop is a host tensor on every place, written back by the ops before they return."""
        return bool(self.not_need_stop[0])

    @staticmethod
    def to_host_message(msg) -> np.ndarray:
        """The step message of speculate_save_output as NumPy (a host tensor on every place, OPS §5.7)."""
        return msg.numpy()


STATE_FIELDS = tuple(f.name for f in fields(ShareInputs) if f.name != "views")
# OPS §2.2: host tensors on every backend.
HOST_FIELDS = ("not_need_stop", "preempted_idx")
DEVICE_FIELDS = tuple(name for name in STATE_FIELDS if name not in HOST_FIELDS)


def _host_view(array: np.ndarray) -> paddle.Tensor:
    return paddle.from_dlpack(array)
