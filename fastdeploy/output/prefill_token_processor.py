"""P's token processor (PD_MTP_FLOW §4.4): an entry [t0] or [t0, d1] ends the request's part on P.

P applies no EOS or max_tokens rule of its own (D decides, §5.2): it records t0, hands the request over
(`hand_off` gathers the prompt's KV, sends the hand-off and keeps P's blocks until D acknowledges it), and
frees the slot in the same call. Every other row of the §6 table (count 0, −9, −3) is the single instance's.
"""
from __future__ import annotations

from collections.abc import Callable

from fastdeploy.engine.request import Request
from fastdeploy.engine.resource_manager import ResourceManager
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.output.token_processor import TokenProcessor

# P-side finish reason of a request whose prompt is done: internal to P, the user sees D's reason.
HANDED_OFF = "handed_off"

HandOff = Callable[[Request, tuple[int, ...]], None]


class PrefillTokenProcessor(TokenProcessor):
    def __init__(self, scheduler: Scheduler, resources: ResourceManager, hand_off: HandOff | None = None):
        super().__init__(scheduler, resources)
        self.hand_off = hand_off   # bound by PDEngine, which owns the connector


    def _append_tokens(self, request: Request, tokens: list[int]) -> bool:
        """`tokens` is [t0] or [t0, d1]: hand over (which takes the request's blocks), then free the slot."""
        if self.hand_off is None:
            raise RuntimeError(f"prefill token processor: request {request.request_id} completed its prompt but "
                               "the instance is not connected to a decode instance")
        request.output_token_ids.append(tokens[0])
        self.hand_off(request, tuple(tokens))
        self.scheduler.finish(request, HANDED_OFF)
        return True
