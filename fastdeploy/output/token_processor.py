"""Reads each step message into what every slot reported (PD_MTP_FLOW §6); the scheduler decides what follows.

The only reason to skip a slot is a count of 0. A count >= 1 is reported whatever the token values are (FastDeploy
skipped a slot whose last token was <= 0, which hid a first-round EOS on D: the hang of PD_MTP_FLOW §8). The
reports go to `Scheduler.update_from_output`, the one place where requests are finished or requeued.
Anomalies (an entry for a slot no running request holds) are logged and kept in `anomalies` so tests can assert
there are none.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from fastdeploy.model_executor.ops import step_message as ops
from fastdeploy.schema.request import Request, RequestStatus
from fastdeploy.schema.step_io import RunnerOutput, SlotEvent, SlotReport

logger = logging.getLogger(__name__)


class TokenProcessor:
    """`owner(slot)` is the request holding the slot (the resource manager's view)."""

    def __init__(self, owner: Callable[[int], Request | None]):
        self.owner = owner
        self.anomalies: list[str] = []

    def process(self, output: RunnerOutput, owner: Callable[[int], Request | None] | None = None
                ) -> list[SlotReport]:
        """One step's message, slot by slot in increasing slot order. `owner`: the slot -> request lookup when the
        step's plan was made, if not the slots' owners now (async scheduling, docs/design.md §10)."""
        decoded = ops.decode_step_message(output.message)
        if decoded is None:
            return []
        owner = self.owner if owner is None else owner
        reports = []
        draft_counts = output.draft_counts.tolist()
        drafts = None if output.first_draft_tokens is None else output.first_draft_tokens.tolist()
        logprobs = output.logprobs
        running = RequestStatus.RUNNING
        for slot, entry in enumerate(decoded[1]):
            if not entry:
                continue
            request = owner(slot)
            if request is not None and request.status is RequestStatus.FINISHED and \
                    entry == [ops.PREEMPTED_TOKEN_ID]:
                continue   # async: a preemption (an abort) sent before the engine saw the round that stopped it
            if request is None or request.status is not running:
                self._anomaly(f"slot {slot} has no running request but reported {entry}")
            elif entry[0] < 0 and entry == [ops.PREEMPTED_TOKEN_ID]:
                reports.append(SlotReport(slot, SlotEvent.PREEMPTED))
            elif entry[0] < 0 and entry == [ops.RECOVERY_STOP]:
                reports.append(SlotReport(slot, SlotEvent.RECOVERY_STOP))
            else:
                tokens = tuple(entry)
                reports.append(SlotReport(slot, SlotEvent.TOKENS, tokens, draft_counts[slot],
                                          -1 if drafts is None else drafts[slot],
                                          () if logprobs is None else logprobs.slot_entries(slot, tokens)))
        return reports

    def _anomaly(self, text: str) -> None:
        logger.error("token processor: %s", text)
        self.anomalies.append(text)
