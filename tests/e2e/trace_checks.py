"""Step-trace checks of invariants I1, I4, I6 (PD_MTP_FLOW §9) and an O3 watchdog, fed by the engine's trace hook.
The per-slot checks need the runner's state between ops: `attach(runner)` traces it (tests/e2e/state_trace.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from fastdeploy.engine.engine import StepTrace
from fastdeploy.model_executor.ops import step_message
from tests.e2e.state_trace import StateTracer

SENTINELS = (step_message.PREEMPTED_TOKEN_ID, step_message.RECOVERY_STOP)   # count words of PD_MTP_FLOW §6 that carry no token


@dataclass
class TraceChecker:
    """Call with every StepTrace; raises AssertionError at the first violation."""

    max_idle_steps: int = 100
    steps: int = 0
    idle_steps: int = 0
    max_idle_seen: int = 0
    parked_steps: int = 0
    preemptions: int = 0
    releases_checked: int = 0
    seen_slots: set = field(default_factory=set)
    tracer: StateTracer | None = None

    def attach(self, runner) -> None:
        """Check the per-slot invariants of `runner`'s steps too (without it only the O3 count is checked)."""
        self.tracer = StateTracer(runner)

    def __call__(self, step: StepTrace) -> None:
        self.steps += 1
        decoded = step_message.decode_step_message(step.output.message)
        entries = decoded[1] if decoded is not None else []
        # A -9 or -3 report is not a token: a preempt/re-admit cycle reports -9 forever without progress.
        progressed = any(e and e[0] not in SENTINELS for e in entries) or bool(step.finished)
        self.idle_steps = 0 if progressed else self.idle_steps + 1
        self.max_idle_seen = max(self.max_idle_seen, self.idle_steps)
        assert self.idle_steps <= self.max_idle_steps, \
            f"O3: no token and no finished request for {self.idle_steps} steps (step {self.steps}); running: " \
            f"{sorted(r.request_id for r in step.slot_owners.values())}"
        self.parked_steps += bool(step.output.parked_slots)
        self.preemptions += sum(e == [step_message.PREEMPTED_TOKEN_ID] for e in entries)
        if self.tracer is not None and self.tracer.last is not None and decoded is not None:
            self._check_slots(step, entries, self.tracer.last)

    def _check_slots(self, step: StepTrace, entries: list[list[int]], t) -> None:
        finished = {id(r) for r in step.finished}
        for j, entry in enumerate(entries):
            preempted = bool(t.preempted_at_entry[j])
            if t.stop_flags[j]:
                assert t.accept_num[j] == 0 and t.seq_lens_decoder[j] == 0, f"I6: slot {j} not cleaned"
                assert not t.pre_ids_written[j], f"I6: pre_ids of stopped slot {j} written"
            if not entry and not preempted:
                assert t.seq_lens_decoder_reported[j] < t.prompt_lens[j] or t.accept_num_reported[j] == 0, \
                    f"I4: slot {j} hidden with dec {t.seq_lens_decoder_reported[j]} >= prompt_lens " \
                    f"{t.prompt_lens[j]} and accept_num {t.accept_num_reported[j]}"
            stopped_now = not t.stop_flags_at_entry[j] and t.stop_flags[j] and not preempted
            if stopped_now and t.accept_num_reported[j] >= 1:
                self._check_release(step, j, entry, finished)

    def _check_release(self, step: StepTrace, slot: int, entry: list[int], finished: set) -> None:
        """I1: the terminating token is reported in this step and the request is freed while processing it."""
        request = step.slot_owners[slot]
        assert entry and entry[-1] >= 0, f"I1: slot {slot} stopped but reported {entry}"
        last = entry[-1]
        assert last in request.eos_token_ids or len(request.output_token_ids) >= request.params.max_tokens, \
            f"I1: slot {slot} reported {entry}, last token is not terminating"
        assert id(request) in finished and request.slot is None and not request.block_ids, \
            f"I1: request {request.request_id} not released in the step that stopped it"
        self.releases_checked += 1
