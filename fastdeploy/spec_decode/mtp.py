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
from dataclasses import dataclass, field

import numpy as np
import paddle

from fastdeploy.schema.step_io import DecodeTask, PrefillTask
from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.models import ForwardBatch, Model
from fastdeploy.model_executor.models.base import take_rows
from fastdeploy.model_executor.step_state import PackedStep, ShareInputs
from fastdeploy.spec_decode.base import Proposal, Proposer


@dataclass(slots=True)
class _Round:
    """The MTP sequences of one sub-step, packed like a target step."""

    slots: list[int] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)
    positions: list[np.ndarray] = field(default_factory=list)
    hidden_rows: list[np.ndarray] = field(default_factory=list)

    def add(self, slot: int, tokens: np.ndarray, start: int, hidden_rows: np.ndarray) -> None:
        self.slots.append(slot)
        self.tokens.append(np.asarray(tokens, np.int64))
        self.positions.append(np.arange(start, start + len(tokens), dtype=np.int64))
        self.hidden_rows.append(np.asarray(hidden_rows, np.int64))

    def batch(self, block_tables: np.ndarray) -> ForwardBatch:
        starts = np.concatenate([[0], np.cumsum([len(t) for t in self.tokens])]).astype(np.int64)
        return ForwardBatch(token_ids=np.concatenate(self.tokens), positions=np.concatenate(self.positions),
                            seq_starts=starts, block_tables=block_tables[self.slots])


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
        first, num_drafts = self._first_round(state, packed)
        drafts = {b: [] for b in first.slots}
        self._forward_seconds = 0.0
        if first.slots:
            last_rows = np.cumsum([len(t) for t in first.tokens]) - 1
            logits, mtp_hidden = self._mtp_forward(first, state, self._gather(hidden, first.hidden_rows),
                                                   last_rows)
            top = logits.numpy().argmax(axis=1)
            chained = _Round()
            for i, b in enumerate(first.slots):
                if num_drafts[b] >= 1:
                    drafts[b].append(int(top[i]))
                if num_drafts[b] >= 2:
                    chained.add(b, [top[i]], int(self.seq_lens_decoder[b]), [last_rows[i]])
            self._chain(state, chained, mtp_hidden, num_drafts, drafts)
        num_slots = state.draft_tokens.shape[0]
        proposed = np.full((num_slots, self.k), -1, np.int64)
        counts = np.full(num_slots, -1, np.int32)
        for b, tokens in drafts.items():
            proposed[b, :len(tokens)] = tokens
            counts[b] = len(tokens)
        return Proposal(proposed, counts, self._forward_seconds)

    def _first_round(self, state: ShareInputs, packed: PackedStep) -> tuple[_Round, dict[int, int]]:
        """Sub-step 1: every position the target committed this step, per running slot."""
        first, num_drafts = _Round(), {}
        for i, b in enumerate(int(s) for s in packed.slots):
            if state.stop_flags[b]:
                self.stop(b)
                continue
            rows = np.asarray(packed.rows(i), np.int64)
            start = int(self.seq_lens_decoder[b])
            if self.seq_lens_encoder[b] > 0:
                end = start + int(self.seq_lens_encoder[b])
                completes = end >= state.prompt_lens[b]
                if completes:
                    self.input_ids[b, end - 1] = state.accept_tokens[b, 0]
                first.add(b, self.input_ids[b, start:end], start, rows)
                self.seq_lens_encoder[b] = 0
                self.seq_lens_decoder[b] = end
                num_drafts[b] = 1 if completes else 0
            else:
                n = int(state.accept_num[b])
                first.add(b, state.accept_tokens[b, :n], start, rows[:n])
                self.seq_lens_decoder[b] = start + n
                num_drafts[b] = self.k
        return first, num_drafts

    def _chain(self, state: ShareInputs, chained: _Round, mtp_hidden: paddle.Tensor, num_drafts: dict[int, int],
               drafts: dict[int, list[int]]) -> None:
        """Sub-steps 2..K: feed the previous draft with the MTP's own hidden state, one position further."""
        for step in range(2, self.k + 1):
            if not chained.slots:
                return
            logits, mtp_hidden = self._mtp_forward(chained, state, self._gather(mtp_hidden, chained.hidden_rows))
            top = logits.numpy().argmax(axis=1)
            following = _Round()
            for i, b in enumerate(chained.slots):
                drafts[b].append(int(top[i]))
                if num_drafts[b] > step:
                    following.add(b, [top[i]], int(chained.positions[i][0]) + 1, [i])
            chained = following

    def _mtp_forward(self, sequences: _Round, state: ShareInputs, prev_hidden: paddle.Tensor,
                     rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        started = time.perf_counter()
        logits, hidden = self.model.mtp_forward(sequences.batch(state.block_tables), prev_hidden, self.kv, rows)
        self._forward_seconds += time.perf_counter() - started
        return logits, hidden

    @staticmethod
    def _gather(hidden: paddle.Tensor, rows: list[np.ndarray]) -> paddle.Tensor:
        """hidden [N, H] -> its `rows`, concatenated [M, H]."""
        return take_rows(hidden, np.concatenate(rows))
