"""Runs the serving loop of one instance: take in the peer's messages, schedule, execute, apply the outputs.

Every role is this one class: a mixed instance, a prefill instance P and a decode instance D differ only in the KV
connector plugged in (fastdeploy/engine/connector/, docs/design.md §6). Nothing under fastdeploy/engine imports
paddle: the model runner (and, under PD, the connector's KV port) is handed in by the entry point that builds
the instance.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from fastdeploy.config import FDConfig, decode_lookahead
from fastdeploy.engine.connector.base import IDLE_POLL_S, KVConnector, MixedConnector, instance_config_hash
from fastdeploy.engine.resource_manager import ResourceManager, ResourceStats
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.output.token_processor import TokenProcessor
from fastdeploy.schema.core_protocol import PrefixCacheStats
from fastdeploy.schema.request import Request, RequestIdInUseError
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.schema.step_io import RunnerOutput, StepPlan, StepTimes


class ModelRunner(Protocol):
    def execute_model(self, plan: StepPlan) -> RunnerOutput: ...


@dataclass(slots=True, frozen=True)
class StepTrace:
    """One step as seen by the optional trace hook (tests assert invariants I1, I4, I6 on it)."""

    plan: StepPlan
    output: RunnerOutput
    slot_owners: dict[int, Request]   # slot -> request before the message was processed
    finished: tuple[Request, ...]
    stats: ResourceStats              # after the message was processed
    times: StepTimes                  # where the step's time went (the engine's and the runner's parts)


@dataclass(slots=True, frozen=True)
class _InFlight:
    """A step submitted to the runner thread whose outputs the engine has not applied yet (async scheduling)."""

    plan: StepPlan
    owners: dict[int, Request]   # slot -> request when the plan was made: the output's reports are theirs
    schedule_s: float            # the plan's schedule part
    output: Future               # of RunnerOutput


_runner_thread: ThreadPoolExecutor | None = None
_runner_thread_lock = threading.Lock()


def runner_thread() -> ThreadPoolExecutor:
    """The one thread that runs every async-scheduling engine's steps in this process: the model (Paddle) is
    only ever called from one thread at a time, as in the sequential loop, and a PD pair's steps stay ordered."""
    global _runner_thread
    with _runner_thread_lock:
        if _runner_thread is None:
            _runner_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fd-runner")
        return _runner_thread


class LLMEngine:
    """One instance. `connector` is the role's KV connector (None: mixed); `idle_poll_s` bounds how long a step
    with nothing to compute waits for the peer's next message (PD roles); `text_identity` names the tokenizer and
    chat template the front end turns bodies into prompt ids with (`tokenizer`, `chat_template`: in the config
    hash)."""

    def __init__(self, config: FDConfig, runner: ModelRunner, eos_token_ids: tuple[int, ...], vocab_size: int,
                 connector: KVConnector | None = None, trace_hook: Callable[[StepTrace], None] | None = None,
                 idle_poll_s: float = IDLE_POLL_S, text_identity: dict[str, str] | None = None):
        self.connector = connector if connector is not None else MixedConnector()
        if self.connector.role != config.role:
            raise ValueError(f"LLMEngine: argument 'connector' is for role {self.connector.role!r}, the config's "
                             f"role is {config.role!r}")
        self.config = config
        self.role = config.role
        self.eos_token_ids = tuple(eos_token_ids)
        self.vocab_size = vocab_size
        self.config_hash = instance_config_hash(config, vocab_size, **(text_identity or {}))
        self.resources = ResourceManager(config.scheduler.max_num_seqs, config.cache.num_kv_blocks,
                                         config.cache.block_size, config.blocks_per_seq,
                                         config.kv_identity, config.num_speculative_tokens > 0,
                                         prefix_caching=config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.resources, self.connector)
        self.connector.bind(self.scheduler, self.resources, self.config_hash)
        self.token_processor = TokenProcessor(self.resources.owner)
        self.runner = runner
        self.trace_hook = trace_hook
        # each computing step's StepTimes, as the step ends (the engine core feeds the metric from it)
        self.step_times_sink: Callable[[StepTimes], None] | None = None
        self.idle_poll_s = idle_poll_s
        self._arrivals = itertools.count()
        self.async_scheduling = config.scheduler.async_scheduling
        self._in_flight: _InFlight | None = None

    # ---- the instance surface (engine/engine_core.py EngineInstance) ----

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    stop_seqs: tuple[tuple[int, ...], ...] = (), prompt: str | None = None,
                    disaggregate_info: dict | None = None) -> Request:
        """Validate, let the connector admit it for this role, and queue it. A request this instance cannot
        serve raises ValueError naming the field and touches nothing."""
        if self.scheduler.find(request_id) is not None:
            raise RequestIdInUseError(f"'request_id' {request_id!r} is already in use")
        if self.resources.is_held(request_id):
            raise RequestIdInUseError(f"'request_id' {request_id!r} is already in use (the KV of its earlier request "
                                      "is still held for a transfer)")
        model_eos = () if params.ignore_eos else self.eos_token_ids
        request = Request(request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params,
                          eos_token_ids=model_eos + tuple(t for t in params.stop_token_ids if t not in model_eos),
                          stop_seqs=tuple(tuple(s) for s in stop_seqs), arrival=next(self._arrivals),
                          prompt=prompt)
        self.validate_request(request)
        status = self.connector.admit(request, disaggregate_info)
        self.scheduler.add_request(request, status)
        return request

    def step(self, max_wait_s: float | None = None) -> list[Request]:
        """One step: take in what the peer sent, schedule, and run the model if anything is to compute; with
        nothing to compute, wait up to `max_wait_s` (default: `idle_poll_s`) for the peer's next message instead
        of spinning. Returns the requests that finished since the previous step."""
        started = time.perf_counter()
        self._poll_peer(0.0)
        plan = self.scheduler.schedule()
        runs = bool(plan.num_tasks or self.scheduler.running)
        if self.async_scheduling:
            self._overlap(plan, runs, started, max_wait_s)
        elif runs:
            scheduled = time.perf_counter()
            owners = self._owners() if self.trace_hook is not None else None
            self._apply(plan, self.runner.execute_model(plan), owners, scheduled - started)
        else:
            self._poll_peer(self.idle_poll_s if max_wait_s is None else max_wait_s)
        return self.scheduler.take_finished()

    def _overlap(self, plan: StepPlan, runs: bool, started: float, max_wait_s: float | None) -> None:
        """Async scheduling (docs/design.md §10): `plan` (step N + 1) was made while step N ran; wait for step N,
        hand N + 1 to the runner thread, then apply step N's outputs while N + 1 computes. The runner's own state
        (stop flags, lengths, drafts) is exact at every step, so only the scheduler's view lags by one step."""
        owners = self._owners() if runs else {}
        scheduled = time.perf_counter()
        previous, self._in_flight = self._in_flight, None
        output = previous.output.result() if previous is not None else None
        if runs:
            self._in_flight = _InFlight(plan, owners, scheduled - started,
                                        runner_thread().submit(self.runner.execute_model, plan))
        if previous is not None:
            self._apply(previous.plan, output, previous.owners, previous.schedule_s)
        elif not runs:
            self._poll_peer(self.idle_poll_s if max_wait_s is None else max_wait_s)

    def _owners(self) -> dict[int, Request]:
        """slot -> request for the running requests (a plan's reports belong to these)."""
        return {slot: r for r in self.scheduler.running if (slot := r.slot) is not None}

    def _apply(self, plan: StepPlan, output: RunnerOutput, owners: dict[int, Request] | None,
               schedule_s: float) -> None:
        """The token processor reads a step's message and the scheduler applies it; `owners`: the slots' owners
        when `plan` was made (None: they are the owners now)."""
        times = output.times if output.times is not None else StepTimes()
        times.schedule += schedule_s
        times.start(time.perf_counter())
        owner = None if owners is None else owners.get
        finished = self.scheduler.update_from_output(self.token_processor.process(output, owner),
                                                     output.parked_slots, plan, owner)
        times.lap("tokens", time.perf_counter())
        if self.step_times_sink is not None:
            self.step_times_sink(times)
        if self.trace_hook is not None:
            self.trace_hook(StepTrace(plan, output, owners or {}, tuple(finished), self.resources.stats(), times))

    def take_in(self) -> None:
        """Take in what the peer sent now, without waiting (what `step` does first): a received hand-off's first
        token is then in its request's output before the step runs the model, so the engine core can report it
        without waiting for that step's end."""
        self._poll_peer(0.0)

    def _poll_peer(self, wait_s: float) -> None:
        """Take in what the peer sent, then free the blocks of every transfer the connector reports finished."""
        self.connector.poll(wait_s)
        for request_id in self.connector.finished_transfers():
            self.resources.free_held(request_id)

    def abort(self, request_id: str, error: str | None = None) -> bool:
        """Stop a live request (docs/glossary.md, "abort"); False for an unknown or finished id. A request the
        runner has not seen is finished at once; a running one in the step that reports its preemption (-9); its
        slot and blocks are freed either way."""
        request = self.scheduler.find(request_id)
        return request is not None and self.scheduler.abort(request, error)

    def has_unfinished(self) -> bool:
        return self._in_flight is not None or self.scheduler.has_unfinished() or \
            self.connector.has_unfinished() or self.resources.has_held()

    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        if not self.resources.prefix_caching:
            return None
        c = self.resources.prefix_counters
        return PrefixCacheStats(requests=c.requests, hit_requests=c.hit_requests, query_tokens=c.query_tokens,
                                hit_tokens=c.hit_tokens, cached_blocks=self.resources.stats().cached_kv_blocks)

    def reset_prefix_cache(self) -> int:
        """Drop every cached KV block no request references (POST /reset_prefix_cache); returns how many."""
        return self.resources.reset_prefix_cache()

    def stats(self) -> ResourceStats:
        return self.resources.stats()

    def num_waiting(self) -> int:
        return self.scheduler.num_waiting()

    def describe(self) -> dict:
        """What a router registers this instance under (SERVICES §5); the hash is PD_MTP_FLOW §3's. The API server
        takes max_model_len from here (a checkpoint's is resolved at build time)."""
        return {"role": self.role, "config_hash": self.config_hash,
                "max_model_len": self.config.scheduler.max_model_len, **self.connector.describe()}

    def pd_counters(self) -> dict | None:
        """The SERVICES §4 PD metrics (None for a mixed instance); the held blocks are the resource manager's."""
        counters = self.connector.counters()
        return None if counters is None else {**counters, "held_blocks": self.resources.num_held_blocks}

    def close(self) -> None:
        if self._in_flight is not None:   # the runner thread may still use the connector's blocks
            self._in_flight.output.exception()
            self._in_flight = None
        self.connector.close()

    # ---- for the watchdog and tests ----

    @property
    def num_progress(self) -> int:
        """Tokens emitted plus requests finished so far. It only grows, so unlike a snapshot of queue sizes it
        cannot cycle: a watchdog that waits for it to grow catches a livelock (engine/watchdog.py)."""
        return self.scheduler.num_progress

    @property
    def anomalies(self) -> list[str]:
        """What the token processor and the scheduler found inconsistent in the step messages (tests: none)."""
        return self.token_processor.anomalies + self.scheduler.anomalies

    def waits_only_on_peer(self) -> bool:
        """Nothing to compute, and some request waits on the other instance (a message, an ack or a deadline)."""
        return not self.scheduler.has_local_work() and self.connector.has_peer_waits()

    def validate_request(self, request: Request) -> None:
        """ValueError naming the field when this instance cannot serve `request` at its full length."""
        cfg = self.config.scheduler
        prompt = request.prompt_token_ids
        if not prompt or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size
                             for t in prompt):
            raise ValueError(f"'prompt_token_ids' must be a non-empty list of ids in [0, {self.vocab_size})")
        if any(t >= self.vocab_size for t in request.params.stop_token_ids):
            raise ValueError(f"'stop_token_ids' must be ids below {self.vocab_size}")
        total = len(prompt) + request.params.max_tokens
        if total > cfg.max_model_len:
            raise ValueError(f"prompt ({len(prompt)} tokens) + 'max_tokens' ({request.params.max_tokens}) exceeds "
                             f"max_model_len ({cfg.max_model_len})")
        if len(request.stop_seqs) > cfg.max_stop_seqs:
            raise ValueError(f"'stop' allows at most {cfg.max_stop_seqs} sequences, got {len(request.stop_seqs)}")
        too_long = next((i for i, s in enumerate(request.stop_seqs) if not 1 <= len(s) <= cfg.max_stop_seq_len), None)
        if too_long is not None:
            raise ValueError(f"'stop' sequences must be 1..{cfg.max_stop_seq_len} tokens long; stop[{too_long}] is "
                             f"{len(request.stop_seqs[too_long])} tokens")
        needed = self.resources.num_blocks_for(total + decode_lookahead(self.config.num_speculative_tokens))
        if needed > self.resources.num_kv_blocks:
            raise ValueError(f"needs {needed} KV blocks at full length, the pool has {self.resources.num_kv_blocks}")
