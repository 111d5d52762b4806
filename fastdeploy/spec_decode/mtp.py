"""The MTP proposer: drafts the next tokens of every running slot with the model's multi-token-prediction module.

The MTP input at position p is (target hidden at p, token at p + 1) and it predicts the token at p + 2
(docs/design.md §3). After a target step that leaves a slot with KV for positions 0 .. dec - 1, the MTP module
has processed the same positions, the last of them with the token just accepted, so its prediction at dec - 1 is
the first draft (for position dec + 1, right after the last accepted token at dec). Further drafts chain the MTP's
own hidden state: sub-step j feeds draft j - 1 at position dec + j - 2. Those speculative MTP cache entries are
overwritten by the next round before anything reads them, so no rollback of the cache is needed.

Per-slot state of its own (PD_MTP_FLOW §5.4 names):

* `seq_lens_encoder`   prompt positions this step's chunk adds (the MTP processes a chunk in the same step as the
                       target; the token after the chunk's last position is the next prompt token, or t0)
* `seq_lens_decoder`   MTP positions committed = the target's seq_lens_decoder at the start of the next round
* `input_ids`          the shifted known tokens: input_ids[b, p] = token at p + 1

The PD_MTP_FLOW §5.4 fields `seq_lens_this_time`, `mask_rollback`, `step_idx` and `stop_flags` are the target's own here
(docs/design.md §5): the proposer reads the target's state, returns its drafts as a `Proposal`, and the model
runner writes them; it keeps no copies.

FastDeploy's `recompute_token_num`, `batch_drop` and proposer-side `pre_ids` have no counterpart: the MTP never
defers prompt positions, never drops a slot from a round, and drafts from its cache alone.
Exactly one draft is produced in the step that completes a prompt (PD_MTP_FLOW §5.4 MTP rule), K from the next round on.
Drafts are the MTP's argmax.
"""
from __future__ import annotations

import time

import numpy as np
import paddle

from fastdeploy.schema.step_io import DecodeTask, PrefillTask
from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.models import ForwardBatch, Model
from fastdeploy.model_executor.models.base import take_rows
from fastdeploy.model_executor.step_state import PackedStep, ShareInputs
from fastdeploy.spec_decode.base import Proposal, Proposer


class MTPProposer(Proposer):
    def __init__(self, model: Model, kv: KVCache, num_slots: int, k: int, max_model_len: int):
        self.model, self.kv, self.k = model, kv, k
        self.seq_lens_encoder = np.zeros(num_slots, np.int32)
        self.seq_lens_decoder = np.zeros(num_slots, np.int32)
        self.input_ids = np.zeros((num_slots, max_model_len), np.int64)
        self._forward_seconds = 0.0

    def insert_prefill(self, task: PrefillTask) -> None:
        b = task.slot
        if task.is_first_chunk:
            self.input_ids[b, :task.prefill_len - 1] = task.token_ids[1:]
        self.seq_lens_encoder[b] = task.end - task.start
        self.seq_lens_decoder[b] = task.start

    def insert_first_round(self, task: DecodeTask) -> None:
        b = task.slot
        self.seq_lens_encoder[b] = 0
        self.seq_lens_decoder[b] = task.prompt_len     # P's MTP cache covers positions 0 .. L - 1

    def stop(self, slot: int) -> None:
        self.seq_lens_encoder[slot] = 0

    def propose(self, state: ShareInputs, packed: PackedStep, hidden: paddle.Tensor) -> Proposal:
        """Sub-step 1 over every position the target committed this step, then sub-steps 2..K chaining the MTP's
        own hidden state; each sub-step's batch is built with array operations over its slots."""
        num_slots = state.draft_tokens.shape[0]
        proposed = np.full((num_slots, self.k), -1, np.int64)
        counts = np.full(num_slots, -1, np.int32)
        self._forward_seconds = 0.0
        batch, hidden_rows, num_drafts = self._first_round(state, packed)
        if batch is None:
            return Proposal(proposed, counts, 0.0)
        slots = packed.slots[~state.stop_flags[packed.slots]]
        counts[slots] = num_drafts
        last_rows = batch.seq_starts[1:] - 1
        logits, mtp_hidden = self._mtp_forward(batch, take_rows(hidden, hidden_rows), last_rows)
        top = logits.numpy().argmax(axis=1)
        drafting = num_drafts >= 1
        proposed[slots[drafting], 0] = top[drafting]
        chained = num_drafts >= 2
        self._chain(state, slots[chained], top[chained], last_rows[chained], num_drafts[chained], mtp_hidden,
                    proposed)
        return Proposal(proposed, counts, self._forward_seconds)

    def _first_round(self, state: ShareInputs, packed: PackedStep
                     ) -> tuple[ForwardBatch | None, np.ndarray, np.ndarray]:
        """Sub-step 1: every position the target committed this step, per running slot (stopped slots are
        forgotten). Returns its batch (None when no slot runs), the target hidden row of each of its tokens [N],
        and the drafts each of its sequences will get [S]."""
        running = ~state.stop_flags[packed.slots]
        self.seq_lens_encoder[packed.slots[~running]] = 0
        seqs = np.flatnonzero(running)
        if not seqs.size:
            return None, np.zeros(0, np.int64), np.zeros(0, np.int64)
        b = packed.slots[seqs]
        start = self.seq_lens_decoder[b].astype(np.int64)
        enc = self.seq_lens_encoder[b].astype(np.int64)
        prefill = enc > 0
        any_prefill = prefill.any()
        if any_prefill:
            completes = prefill & (start + enc >= state.prompt_lens[b])
            done = b[completes]   # the prompt's last input is t0, the token verify just chose
            self.input_ids[done, start[completes] + enc[completes] - 1] = state.accept_tokens[done, 0]
        lens = np.where(prefill, enc, state.accept_num[b]) if any_prefill else state.accept_num[b].astype(np.int64)
        starts = np.zeros(seqs.size + 1, np.int64)
        np.cumsum(lens, out=starts[1:])
        seq = np.repeat(np.arange(seqs.size), lens)
        offset = np.arange(starts[-1], dtype=np.int64) - starts[seq]
        slot, positions = b[seq], start[seq] + offset
        if any_prefill:
            tokens = np.empty(positions.size, np.int64)
            pre = prefill[seq]
            tokens[pre] = self.input_ids[slot[pre], positions[pre]]
            tokens[~pre] = state.accept_tokens[slot[~pre], offset[~pre]]
        else:   # decode rounds only: the accepted tokens
            tokens = state.accept_tokens[slot, offset]
        hidden_rows = packed.batch.seq_starts[seqs][seq] + offset
        self.seq_lens_encoder[b] = 0
        self.seq_lens_decoder[b] = start + lens
        num_drafts = np.where(prefill, completes, self.k) if any_prefill else np.full(seqs.size, self.k, np.int64)
        return (ForwardBatch.unchecked(token_ids=tokens, positions=positions, seq_starts=starts,
                             block_tables=state.block_tables[b]), hidden_rows, num_drafts)

    def _chain(self, state: ShareInputs, slots: np.ndarray, tokens: np.ndarray, hidden_rows: np.ndarray,
               num_drafts: np.ndarray, mtp_hidden: paddle.Tensor, proposed: np.ndarray) -> None:
        """Sub-steps 2..K: feed the previous draft with the MTP's own hidden state, one position further (the
        first chained position is the slot's committed MTP length)."""
        positions = self.seq_lens_decoder[slots].astype(np.int64)
        for step in range(2, self.k + 1):
            if not slots.size:
                return
            batch = ForwardBatch.unchecked(token_ids=tokens, positions=positions,
                                 seq_starts=np.arange(slots.size + 1, dtype=np.int64),
                                 block_tables=state.block_tables[slots])
            logits, mtp_hidden = self._mtp_forward(batch, take_rows(mtp_hidden, hidden_rows))
            top = logits.numpy().argmax(axis=1)
            proposed[slots, step - 1] = top
            going = num_drafts > step
            slots, tokens, positions = slots[going], top[going], positions[going] + 1
            hidden_rows, num_drafts = np.flatnonzero(going), num_drafts[going]

    def _mtp_forward(self, batch: ForwardBatch, prev_hidden: paddle.Tensor,
                     rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        started = time.perf_counter()
        logits, hidden = self.model.mtp_forward(batch, prev_hidden, self.kv, rows)
        self._forward_seconds += time.perf_counter() - started
        return logits, hidden
