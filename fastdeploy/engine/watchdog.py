"""Fails a serving loop that stops making progress, naming the requests it is stuck on (PD_MTP_FLOW §10, O3).

Progress is a count that only grows: tokens emitted plus requests finished (`LLMEngine.num_progress`, plus
`PDEngine.num_finished` for a PD pair). A snapshot of queue sizes and token counts is not enough: a livelock that
preempts and re-admits the same request makes such a snapshot cycle through a few values, so "it changed" is true
forever. The count is bounded by the work requested (every request emits at most max_tokens tokens and finishes
once), so a loop that fails after `max_idle_steps` steps without growth ends within
(work + 1) * max_idle_steps steps, never at an outer timeout.
"""
from __future__ import annotations

from fastdeploy.engine.engine import LLMEngine
from fastdeploy.engine.decode_scheduler import DecodeScheduler
from fastdeploy.engine.pd import PDEngine
from fastdeploy.engine.request import Request

Engine = LLMEngine | PDEngine


def progress_count(engine: Engine) -> int:
    """The monotone progress count of one instance or of a PD pair."""
    if isinstance(engine, PDEngine):
        return engine.prefill.engine.num_progress + engine.decode.engine.num_progress + engine.num_finished
    return engine.num_progress


def waits_only_on_connector(engine: Engine) -> bool:
    """True when a PD pair has nothing to compute and every unfinished request waits on the connector (a message
    or acknowledgement in flight, or a deadline): such steps are bounded by the hand-off deadlines, not by the
    step count. A request that P or D still holds is local work and gets no such allowance."""
    return (isinstance(engine, PDEngine) and engine.has_peer_waits()
            and not engine.prefill.engine.has_unfinished() and not engine.decode.engine.has_unfinished())


def describe_request(request: Request) -> str:
    """Id, state, tokens so far, computed positions, and the slot and blocks it holds."""
    where = f"slot {request.slot}" if request.slot is not None else "no slot"
    return (f"{request.request_id} ({request.status.name.lower()}{', parked' if request.is_parked else ''}, "
            f"{len(request.output_token_ids)} tokens, {request.num_computed_tokens} computed, {where}, "
            f"{len(request.block_ids)} blocks)")


def describe_unfinished(engine: Engine) -> str:
    """Every unfinished request the instance(s) hold, with state, tokens so far and what it holds."""
    if isinstance(engine, PDEngine):
        prefill, decode = engine.prefill.engine, engine.decode.engine
        return (f"P: {describe_unfinished(prefill)}; D: {describe_unfinished(decode)}; "
                f"P resources {prefill.stats()}; D resources {decode.stats()}")
    scheduler = engine.scheduler
    queued = [*scheduler.waiting, *scheduler.running]
    if isinstance(scheduler, DecodeScheduler):   # hand-offs received, waiting for a D slot
        queued += [request for request, _ in scheduler.prefilled]
    return "[" + "; ".join(describe_request(r) for r in queued) + "]"


class Watchdog:
    """Call `after_step()` after every step; raises RuntimeError after `max_idle_steps` steps in a row in which
    the progress count did not grow. With `allow_connector_waits`, steps that only wait on the connector do not
    count: only for a clock that moves (a deadline then ends the wait); on a frozen test clock they would never end.
    """

    def __init__(self, engine: Engine, max_idle_steps: int, owner: str = "engine",
                 allow_connector_waits: bool = False):
        if isinstance(max_idle_steps, bool) or not isinstance(max_idle_steps, int) or max_idle_steps < 1:
            raise ValueError(f"{owner}: argument 'max_idle_steps' must be an int >= 1, got {max_idle_steps!r}")
        self.engine = engine
        self.max_idle_steps = max_idle_steps
        self.owner = owner
        self.allow_connector_waits = allow_connector_waits
        self.steps = 0
        self.idle_steps = 0
        self._last = progress_count(engine)

    def after_step(self) -> None:
        self.steps += 1
        count = progress_count(self.engine)
        grew, self._last = count > self._last, count
        waiting = self.allow_connector_waits and waits_only_on_connector(self.engine)
        self.idle_steps = 0 if grew or waiting else self.idle_steps + 1
        if self.idle_steps >= self.max_idle_steps:
            raise RuntimeError(f"{self.owner}: no token emitted and no request finished in {self.idle_steps} steps "
                               f"(step {self.steps}); stuck: {describe_unfinished(self.engine)}")
