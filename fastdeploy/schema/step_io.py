"""The typed messages between the engine and a model runner: a step plan down, a runner output up.

Plain slotted dataclasses of ints, tuples and NumPy arrays: nothing here is a tensor, so a plan or an output could
cross a process boundary unchanged.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from fastdeploy.schema.request import TokenLogprob


@dataclass(slots=True, frozen=True)
class SlotSampling:
    """What the runner needs to verify and stop a slot's tokens (exactly the values the request uses)."""

    temperature: float
    top_p: float
    seed: int
    min_tokens: int
    max_tokens: int
    eos_token_ids: tuple[int, ...]
    stop_seqs: tuple[tuple[int, ...], ...]
    logprobs: int | None = None   # top alternatives per emitted token (SamplingParams.logprobs); None: none computed
    # The sampling controls of docs/serving.md (SamplingParams' neutral values by default)
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # The request's prompt ids when a penalty is set (repetition_penalty counts them; D has no prompt in its
    # input_ids), else empty: the outputs so far the runner reads from pre_ids
    prompt_token_ids: tuple[int, ...] = ()

    @property
    def uses_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


@dataclass(slots=True, frozen=True)
class PrefillTask:
    """Compute known tokens [start, end) of the request in `slot` (PD_MTP_FLOW §4.1, §7.2).

    `token_ids` holds all known tokens (prompt + outputs so far) on the first chunk of the slot's residency and
    is empty on later chunks: the runner keeps them in input_ids. The first chunk starts at 0, or past the
    positions whose KV the shared prefix-cache blocks at the head of `block_ids` hold (PD_MTP_FLOW §13).
    `output_token_ids` (outputs known before this residency) matters on the final chunk (end == prefill_len):
    step_idx and pre_ids start from them.
    """

    slot: int
    start: int
    end: int
    prefill_len: int
    token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    sampling: SlotSampling

    @property
    def completes_prefill(self) -> bool:
        return self.end == self.prefill_len

    @property
    def is_first_chunk(self) -> bool:
        return bool(self.token_ids)


@dataclass(slots=True, frozen=True)
class DecodeTask:
    """D-side first-round insertion of a request prefilled on P (PD_MTP_FLOW §5.3): the prompt's KV is in
    `block_ids`, `draft_token_ids` = [t0, d1] with MTP, [t0] without."""

    slot: int
    prompt_len: int
    draft_token_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    sampling: SlotSampling


@dataclass(slots=True, frozen=True)
class BlockTableTask:
    """Replace a running slot's block table (new blocks for decode lookahead, or to resume a parked slot)."""

    slot: int
    block_ids: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class PreemptTask:
    """Preempt the slot (PD_MTP_FLOW §7.2); the engine frees it when the message reports -9."""

    slot: int


@dataclass(slots=True)
class StepPlan:
    step: int
    prefill_tasks: list[PrefillTask] = field(default_factory=list)
    decode_tasks: list[DecodeTask] = field(default_factory=list)
    block_table_tasks: list[BlockTableTask] = field(default_factory=list)
    preempt_tasks: list[PreemptTask] = field(default_factory=list)

    @property
    def num_tasks(self) -> int:
        return (len(self.prefill_tasks) + len(self.decode_tasks) + len(self.block_table_tasks)
                + len(self.preempt_tasks))


@dataclass(slots=True)
class StepLogprobs:
    """Log probabilities of the tokens a step emitted (docs/design.md §5, "Logprobs"), for the slots whose request
    asked; T = K + 1 token columns as in the step message, N = the largest number of alternatives asked this step.

    token_logprobs: [B, T] float64, row b column i: the logprob of the i-th token slot b emitted; NaN where the slot
    did not ask or emitted fewer tokens.
    top_token_ids: [B, T, N] int64, the most likely ids at that token's position, most likely first; -1 past the
    slot's own number of alternatives.
    top_logprobs: [B, T, N] float64, their logprobs; NaN where top_token_ids is -1.
    """

    token_logprobs: np.ndarray
    top_token_ids: np.ndarray
    top_logprobs: np.ndarray

    def slot_entries(self, slot: int, token_ids: tuple[int, ...]) -> tuple[TokenLogprob, ...]:
        """The entries of the tokens `slot` emitted, in order; () when the slot's request did not ask."""
        if np.isnan(self.token_logprobs[slot, 0]):
            return ()
        entries = []
        for i, token in enumerate(token_ids):
            ids = self.top_token_ids[slot, i]
            keep = ids >= 0
            entries.append(TokenLogprob(token, float(self.token_logprobs[slot, i]), tuple(ids[keep].tolist()),
                                        tuple(self.top_logprobs[slot, i][keep].tolist())))
        return tuple(entries)


STEP_PARTS = ("schedule", "prepare", "sample_verify", "state_ops", "draft", "tokens", "outputs")


@dataclass(slots=True)
class StepTimes:
    """Where one step's time went, in seconds (benchmarks/step_overhead.py, the step trace, the metric
    `fastdeploy:step_host_seconds`). The host's parts, in step order: schedule (the peer's messages and the
    scheduler's plan), prepare (task insertion, parked slots, packing the target's input), sample_verify (the
    target's logits to host, verify, logprob rows), state_ops (the post-process and block ops, writing the drafts),
    draft (the MTP proposer's own work outside its passes: packing its input, choosing drafts), outputs (the
    runner's report), tokens (the token processor and the scheduler applying the report). `passes` is the
    model's forward passes (target and MTP), not host work."""

    schedule: float = 0.0
    prepare: float = 0.0
    sample_verify: float = 0.0
    state_ops: float = 0.0
    draft: float = 0.0
    outputs: float = 0.0
    tokens: float = 0.0
    passes: float = 0.0
    _mark: float = 0.0

    def start(self, now: float) -> None:
        self._mark = now

    def lap(self, part: str, now: float, minus: float = 0.0) -> None:
        """Add the time since the previous mark, less `minus` (a pass inside the interval), to `part`."""
        setattr(self, part, getattr(self, part) + now - self._mark - minus)
        self._mark = now

    @property
    def host(self) -> float:
        """The host's work: every part but the passes."""
        return sum(getattr(self, part) for part in STEP_PARTS)


@dataclass(slots=True)
class RunnerOutput:
    """What one execute_model call reports back.

    message: the step message of OPS §5.7 (int64 [2 + B + B*T], or [0] when the step ended early at stage 4).
    draft_counts: [B] int32, drafts verified by each slot's decode round this step; -1 where the slot ran no
    decode round (idle, prefill, parked, stopped).
    parked_slots: slots parked (is_block_step) after this step's block management.
    first_draft_tokens: [B] int64 on P (PD_MTP_FLOW §4.3): d1 of each slot whose prompt completed this step and
    whose t0 did not stop it, -1 elsewhere; None on other roles or without speculation. It travels beside the
    message instead of inside it, so the message layout of OPS §5.7 is written in one place (ops/step_message.py).
    """

    message: np.ndarray
    draft_counts: np.ndarray
    parked_slots: tuple[int, ...]
    forward_seconds: float = 0.0
    first_draft_tokens: np.ndarray | None = None
    logprobs: StepLogprobs | None = None
    times: StepTimes | None = None   # the runner's parts of the step (the engine adds schedule and tokens)


class SlotEvent(enum.Enum):
    """What one slot's entry of a step message says (PD_MTP_FLOW §6)."""

    TOKENS = "tokens"              # 1..T tokens emitted
    PREEMPTED = "preempted"        # count -9: the preemption the scheduler asked for took effect
    RECOVERY_STOP = "recovery"     # count -3: the recovery path stopped the request


@dataclass(slots=True, frozen=True)
class SlotReport:
    """One slot's part of a step, as the token processor reads it from the message; the scheduler decides from
    it what happens to the request (one finish path)."""

    slot: int
    event: SlotEvent
    token_ids: tuple[int, ...] = ()   # TOKENS: in order
    num_drafts: int = -1              # drafts verified by the slot's decode round; -1: no decode round (prefill)
    first_draft: int = -1             # P (PD_MTP_FLOW §4.3): d1 drafted in the step that completed the prompt
    logprobs: tuple[TokenLogprob, ...] = ()   # TOKENS: one per token when the request asked, else empty
