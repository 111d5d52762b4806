"""Turns each step message into request outputs, finishing requests and freeing what they hold (PD_MTP_FLOW §6)."""
from __future__ import annotations

import logging

from fastdeploy.engine.request import Request
from fastdeploy.engine.resource_manager import ResourceManager
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.step_io import RunnerOutput
from fastdeploy.model_executor.ops import step_message as ops

logger = logging.getLogger(__name__)


class TokenProcessor:
    """Applies the PD_MTP_FLOW §6 table slot by slot, in increasing slot order.

    The only reason to skip a slot is a count of 0. A count >= 1 is processed whatever the token values are
    (FastDeploy skipped a slot whose last token was <= 0, which hid a first-round EOS on D: the hang of PD_MTP_FLOW §8).
    Finishing frees the slot and KV blocks inside this call, so the scheduler's next step can reuse them.
    Anomalies (an entry for an empty slot, tokens after a finishing token) are logged and kept in `anomalies`
    so tests can assert there are none.
    """

    def __init__(self, scheduler: Scheduler, resources: ResourceManager):
        self.scheduler = scheduler
        self.resources = resources
        self.anomalies: list[str] = []

    def process(self, output: RunnerOutput) -> list[Request]:
        """Apply one step's message; returns the requests finished by it."""
        decoded = ops.decode_step_message(output.message)
        if decoded is None:
            return []
        _, entries = decoded
        finished = []
        for slot, entry in enumerate(entries):
            request = self.resources.owner(slot)
            if request is None:
                if entry:
                    self._anomaly(f"slot {slot} has no request but reported {entry}")
                continue
            if not entry:
                continue
            if entry == [ops.PREEMPTED_TOKEN_ID] and request.is_aborting:
                self.scheduler.finish(request, "abort", error=request.error)
                finished.append(request)
            elif entry == [ops.PREEMPTED_TOKEN_ID]:
                self.scheduler.requeue_preempted(request)
            elif entry == [ops.RECOVERY_STOP]:
                self.scheduler.finish(request, "abort", error="stopped by the recovery path")
                finished.append(request)
            else:
                self._record_round(request, int(output.draft_counts[slot]), len(entry))
                if self._append_tokens(request, self._tokens_of(output, slot, entry)):
                    finished.append(request)
        return finished

    def _tokens_of(self, output: RunnerOutput, slot: int, entry: list[int]) -> list[int]:
        """The tokens slot `slot` reported this step: its message entry."""
        return entry

    def _append_tokens(self, request: Request, tokens: list[int]) -> bool:
        """Append in order; the first token that is an EOS id or reaches max_tokens finishes the request."""
        for i, token in enumerate(tokens):
            request.output_token_ids.append(token)
            reason = "stop" if token in request.eos_token_ids else (
                "length" if len(request.output_token_ids) >= request.params.max_tokens else None)
            if reason is not None:
                if i + 1 < len(tokens):
                    self._anomaly(f"request {request.request_id}: tokens {tokens[i + 1:]} after its "
                                  f"finishing token were dropped")
                self.scheduler.finish(request, reason)
                return True
        return False

    @staticmethod
    def _record_round(request: Request, num_drafts: int, num_tokens: int) -> None:
        if num_drafts < 0:
            return
        metrics = request.metrics
        metrics.num_decode_rounds += 1
        metrics.num_draft_tokens += num_drafts
        metrics.num_accepted_drafts += num_tokens - 1
        metrics.accepted_per_round.append(num_tokens)

    def _anomaly(self, text: str) -> None:
        logger.error("token processor: %s", text)
        self.anomalies.append(text)
