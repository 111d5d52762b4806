"""The proposer interface: a drafter with its own per-slot state, driven by the model runner at OPS §4 stage 8."""
from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
import paddle

from fastdeploy.schema.step_io import DecodeTask, PrefillTask
from fastdeploy.model_executor.step_state import PackedStep, ShareInputs


@dataclass(slots=True, frozen=True)
class Proposal:
    """What one `propose` call drafted; the model runner writes it into the state the ops read."""

    draft_tokens: np.ndarray      # [B, K] int64: the drafts of each slot for its next round, -1 padded
    num_drafts: np.ndarray        # [B] int32: drafts of each slot (0 ..= K); -1 where the proposer did not run
    forward_seconds: float        # spent in the drafter's forward passes (for the engine-overhead benchmark)


class Proposer(abc.ABC):
    """Insertion hooks mirror the target runner's (stage 1); `propose` runs after post-process."""

    @abc.abstractmethod
    def insert_prefill(self, task: PrefillTask) -> None:
        """A prefill chunk was inserted into the target slot."""

    @abc.abstractmethod
    def insert_first_round(self, task: DecodeTask) -> None:
        """A request prefilled on P was inserted on D (PD_MTP_FLOW §5.4)."""

    @abc.abstractmethod
    def stop(self, slot: int) -> None:
        """The slot was preempted or emptied: forget it."""

    @abc.abstractmethod
    def propose(self, state: ShareInputs, packed: PackedStep, hidden: paddle.Tensor) -> Proposal:
        """Consume this step's target hidden states [N, H] and accepted tokens (read-only) and return the next
        round's drafts."""
