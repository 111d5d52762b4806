"""P's token processor (PD_MTP_FLOW §4.4): an entry [t0] or [t0, d1] ends the request's part on P.

P applies no EOS or max_tokens rule of its own (D decides, PD_MTP_FLOW §5.2): it records t0, hands the request over
through the `hand_off` callable it is built with (the prefill instance's connector: it takes the request's blocks, sends
the hand-off and holds the blocks until D acknowledges it), and frees the slot in the same call. Every other row of
the PD_MTP_FLOW §6 table (count 0, −9, −3) is the single instance's.
"""
from __future__ import annotations

from collections.abc import Callable

from fastdeploy.engine.request import FINISH_HANDED_OFF, Request
from fastdeploy.engine.resource_manager import ResourceManager
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.step_io import RunnerOutput
from fastdeploy.output.token_processor import TokenProcessor

HandOff = Callable[[Request, tuple[int, ...]], None]


class PrefillTokenProcessor(TokenProcessor):
    def __init__(self, scheduler: Scheduler, resources: ResourceManager, hand_off: HandOff):
        super().__init__(scheduler, resources)
        self.hand_off = hand_off

    def _tokens_of(self, output: RunnerOutput, slot: int, entry: list[int]) -> list[int]:
        """P's message reports [t0]; d1 travels in `first_draft_tokens` (−1: t0 stopped the slot, or no MTP)."""
        drafts = output.first_draft_tokens
        if drafts is None or drafts[slot] < 0:
            return entry
        return [*entry, int(drafts[slot])]

    def _append_tokens(self, request: Request, tokens: list[int]) -> bool:
        """`tokens` is [t0] or [t0, d1]: hand over (which takes the request's blocks), then free the slot."""
        request.output_token_ids.append(tokens[0])
        self.hand_off(request, tuple(tokens))
        self.scheduler.finish(request, FINISH_HANDED_OFF)
        return True
