"""Runs the serving loop of one instance: schedule, execute, process the output.

Nothing under fastdeploy/engine imports paddle: the model runner and the token processor (which decodes step
messages with the ops package) are handed in by the entry point that builds the instance.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from fastdeploy.config import FDConfig
from fastdeploy.engine.pd_connector import instance_config_hash
from fastdeploy.engine.request import Request
from fastdeploy.engine.resource_manager import ResourceManager, ResourceStats
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.step_io import RunnerOutput, StepPlan


class ModelRunner(Protocol):
    collect_trace: bool

    def execute_model(self, plan: StepPlan) -> RunnerOutput: ...


class OutputProcessor(Protocol):
    def process(self, output: RunnerOutput) -> list[Request]: ...


@dataclass(slots=True, frozen=True)
class StepTrace:
    """One step as seen by the optional trace hook (tests assert invariants I1, I4, I6 on it)."""

    plan: StepPlan
    output: RunnerOutput
    slot_owners: dict[int, Request]   # slot -> request before the message was processed
    finished: tuple[Request, ...]
    stats: ResourceStats              # after the message was processed


class LLMEngine:
    def __init__(self, config: FDConfig, runner: ModelRunner, eos_token_ids: tuple[int, ...], vocab_size: int,
                 make_output_processor: Callable[[Scheduler, ResourceManager], OutputProcessor],
                 trace_hook: Callable[[StepTrace], None] | None = None,
                 make_scheduler: Callable[[FDConfig, ResourceManager], Scheduler] = Scheduler):
        self.config = config
        self.eos_token_ids = tuple(eos_token_ids)
        self.vocab_size = vocab_size
        self.resources = ResourceManager(config.scheduler.max_num_seqs, config.cache.num_kv_blocks,
                                         config.cache.block_size, config.blocks_per_seq)
        self.scheduler = make_scheduler(config, self.resources)   # D of a PD pair: DecodeScheduler
        self.runner = runner
        self.output_processor = make_output_processor(self.scheduler, self.resources)
        self.trace_hook = trace_hook
        runner.collect_trace = trace_hook is not None
        self._arrivals = itertools.count()
        self._num_progress = 0

    @property
    def num_progress(self) -> int:
        """Tokens emitted plus requests finished so far. It only grows, so unlike a snapshot of queue sizes it
        cannot cycle: a watchdog that waits for it to grow catches a livelock (engine/watchdog.py)."""
        return self._num_progress

    def make_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                     stop_seqs: tuple[tuple[int, ...], ...] = (), prompt: str | None = None) -> Request:
        """Build and validate one request without queueing it (the one construction path, shared by the PD
        instances); a bad request raises ValueError and touches nothing."""
        request = Request(request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params,
                          eos_token_ids=self.eos_token_ids + tuple(t for t in params.stop_token_ids
                                                                   if t not in self.eos_token_ids),
                          stop_seqs=tuple(tuple(s) for s in stop_seqs), arrival=next(self._arrivals),
                          prompt=prompt)
        self.validate_request(request)
        return request

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    stop_seqs: tuple[tuple[int, ...], ...] = (), prompt: str | None = None) -> Request:
        """Validate and queue one request; a bad request raises ValueError here and touches nothing."""
        request = self.make_request(request_id, prompt_token_ids, params, stop_seqs, prompt)
        self.submit(request)
        return request

    def submit(self, request: Request) -> None:
        """Queue a request built by `make_request`."""
        self.scheduler.add_request(request)

    def step(self) -> list[Request]:
        plan = self.scheduler.schedule()
        output = self.runner.execute_model(plan)
        owners = {slot: r for r in self.scheduler.running if (slot := r.slot) is not None}
        emitted_before = sum(len(r.output_token_ids) for r in owners.values())
        finished = self.output_processor.process(output)
        # A preempted request keeps its outputs, so this difference counts only newly emitted tokens.
        self._num_progress += sum(len(r.output_token_ids) for r in owners.values()) - emitted_before + len(finished)
        self.scheduler.mark_parked(output.parked_slots)
        if self.trace_hook is not None:
            self.trace_hook(StepTrace(plan, output, owners, tuple(finished), self.resources.stats()))
        return finished

    def abort(self, request_id: str, error: str | None = None) -> bool:
        """Stop a live request (docs/glossary.md, "abort"); False for an unknown or finished id. A waiting request
        is finished at once, a running one in the step that reports its preemption (-9), slot and blocks freed."""
        request = self.scheduler.find(request_id)
        return request is not None and self.scheduler.abort(request, error)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def stats(self) -> ResourceStats:
        return self.resources.stats()

    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def describe(self) -> dict:
        """What a router registers this instance under (SERVICES §5); the hash is PD_MTP_FLOW §3's."""
        return {"role": "mixed", "config_hash": instance_config_hash(self.config, self.vocab_size)}

    def pd_counters(self) -> None:
        """A mixed instance has no PD connector (SERVICES §4 PD metrics)."""
        return None

    def close(self) -> None:
        """Nothing outside the process to release."""

    def validate_request(self, request: Request) -> None:
        """ValueError naming the field when this instance cannot serve `request` at its full length."""
        cfg, rid = self.config.scheduler, request.request_id
        prompt = request.prompt_token_ids
        if not prompt or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size
                             for t in prompt):
            raise ValueError(f"request {rid}: 'prompt_token_ids' must be a non-empty list of ids in "
                             f"[0, {self.vocab_size})")
        if any(t >= self.vocab_size for t in request.params.stop_token_ids):
            raise ValueError(f"request {rid}: 'stop_token_ids' must be ids below {self.vocab_size}")
        total = len(prompt) + request.params.max_tokens
        if total > cfg.max_model_len:
            raise ValueError(f"request {rid}: prompt ({len(prompt)} tokens) + max_tokens "
                             f"({request.params.max_tokens}) exceeds max_model_len ({cfg.max_model_len})")
        if len(request.stop_seqs) > cfg.max_stop_seqs or \
                any(not 1 <= len(s) <= cfg.max_stop_seq_len for s in request.stop_seqs):
            raise ValueError(f"request {rid}: 'stop' allows at most {cfg.max_stop_seqs} sequences of 1.."
                             f"{cfg.max_stop_seq_len} tokens, got lengths {[len(s) for s in request.stop_seqs]}")
        k = self.config.num_speculative_tokens
        needed = self.resources.num_blocks_for(total + 3 * k + 4)
        if needed > self.resources.num_kv_blocks:
            raise ValueError(f"request {rid}: needs {needed} KV blocks at full length, the pool has "
                             f"{self.resources.num_kv_blocks}")
