"""Fails a serving loop that stops making progress, naming the requests it is stuck on (PD_MTP_FLOW §10, O3).

Progress is a count that only grows: tokens emitted plus requests finished, summed over the instances a loop
drives (one, or a PD pair in one process). A snapshot of queue sizes and token counts is not enough: a livelock
that preempts and re-admits the same request makes such a snapshot cycle through a few values, so "it changed" is
true forever. The count is bounded by the work requested (every request emits at most max_tokens tokens and
finishes once), so a loop that fails after `max_idle_steps` steps without growth ends within
(work + 1) * max_idle_steps steps, never at an outer timeout.
"""
from __future__ import annotations

from collections.abc import Sequence

from fastdeploy.engine.engine import LLMEngine
from fastdeploy.schema.request import Request


def describe_request(request: Request, state: str) -> str:
    """Id, state, tokens so far, computed positions, and the slot and blocks it holds."""
    where = f"slot {request.slot}" if request.slot is not None else "no slot"
    return (f"{request.request_id} ({state}{', parked' if request.is_parked else ''}, "
            f"{len(request.output_token_ids)} tokens, {request.num_computed_tokens} computed, {where}, "
            f"{len(request.block_ids)} blocks)")


def describe_unfinished(engine: LLMEngine) -> str:
    """Every unfinished request one instance holds, wherever it is, with what it holds; then what its connector
    holds and the instance's resources."""
    scheduler = engine.scheduler
    peer = "waiting for D's reservation" if engine.role == "prefill" else "waiting for P's hand-off"
    entries = ([describe_request(r, "waiting") for r in scheduler.waiting]
               + [describe_request(r, peer) for r in scheduler.peer_waiting.values()]
               + [describe_request(r, "hand-off received, first round not scheduled") for r in scheduler.prefilled]
               + [describe_request(r, "running") for r in scheduler.running])
    held = engine.connector.describe_held()
    return (f"{engine.role}: [" + "; ".join(entries) + "]" + (f"; connector: {held}" if held else "")
            + f"; resources {engine.stats()}")


class Watchdog:
    """Call `after_step()` after every step of `engines` (one instance, or every instance the loop steps); raises
    RuntimeError after `max_idle_steps` steps in a row in which the progress count did not grow. With
    `allow_connector_waits`, steps in which no instance has anything to compute and some request waits on the
    peer do not count: only for a clock that moves (a deadline then ends the wait); on a frozen test clock they
    would never end."""

    def __init__(self, engines: LLMEngine | Sequence[LLMEngine], max_idle_steps: int, owner: str = "engine",
                 allow_connector_waits: bool = False):
        if isinstance(max_idle_steps, bool) or not isinstance(max_idle_steps, int) or max_idle_steps < 1:
            raise ValueError(f"{owner}: argument 'max_idle_steps' must be an int >= 1, got {max_idle_steps!r}")
        self.engines = (engines,) if isinstance(engines, LLMEngine) else tuple(engines)
        self.max_idle_steps = max_idle_steps
        self.owner = owner
        self.allow_connector_waits = allow_connector_waits
        self.steps = 0
        self.idle_steps = 0
        self._last = self.progress()

    def progress(self) -> int:
        return sum(engine.num_progress for engine in self.engines)

    def waits_only_on_connector(self) -> bool:
        """No instance has anything to compute and some request waits on the other instance: such steps are
        bounded by the hand-off deadlines, not by the step count."""
        return (all(not e.scheduler.has_local_work() for e in self.engines)
                and any(e.waits_only_on_peer() for e in self.engines))

    def after_step(self) -> None:
        self.steps += 1
        count = self.progress()
        grew, self._last = count > self._last, count
        waiting = self.allow_connector_waits and self.waits_only_on_connector()
        self.idle_steps = 0 if grew or waiting else self.idle_steps + 1
        if self.idle_steps >= self.max_idle_steps:
            stuck = "; ".join(describe_unfinished(engine) for engine in self.engines)
            raise RuntimeError(f"{self.owner}: no token emitted and no request finished in {self.idle_steps} steps "
                               f"(step {self.steps}); stuck: {stuck}")
