"""The decode instance D of a PD pair: an LLMEngine that reserves blocks, tells P, and decodes P's hand-offs.

PD_MTP_FLOW §5 and SERVICES §6 steps 2 and 5. A request waits for D's blocks (DECODE_ALLOCATION), D reserves
positions 0..L + 2K + 2 and sends the reservation to P, then waits for P's hand-off (PREFILL_RESULT). On receipt
D runs the PD_MTP_FLOW §5.2 checks, writes P's KV into its blocks and queues the request for a slot, acknowledging every
hand-off; it streams [t0] + its own tokens (the request's outputs start with t0). It talks to P only through the
`HandoffTransport`; nothing here imports paddle.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from fastdeploy.config import FDConfig
from fastdeploy.engine.decode_scheduler import DecodeScheduler
from fastdeploy.engine.engine import LLMEngine, ModelRunner, OutputProcessor, StepTrace
from fastdeploy.engine.pd_connector import IDLE_POLL_S, DisaggregateInfo, KVPort, instance_config_hash
from fastdeploy.engine.request import PDTimings, Request
from fastdeploy.engine.resource_manager import ResourceManager, ResourceStats
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.splitwise import (
    FINISH_REASON_FAILED,
    Clock,
    Deadline,
    FinishAtReceipt,
    HandoffDeadlines,
    HandoffTransport,
    Insert,
    MonotonicClock,
    PendingWaits,
    ReceiptCheck,
    Reject,
    TransportFullError,
    WaitKind,
    receive_handoff,
)

logger = logging.getLogger(__name__)


class DecodeInstance:
    def __init__(self, config: FDConfig, runner: ModelRunner, eos_token_ids: tuple[int, ...], vocab_size: int,
                 make_output_processor: Callable[[Scheduler, ResourceManager], OutputProcessor], kv: KVPort,
                 transport: HandoffTransport, clock: Clock | None = None,
                 deadlines: HandoffDeadlines | None = None, trace_hook: Callable[[StepTrace], None] | None = None,
                 idle_poll_s: float = IDLE_POLL_S):
        if config.role != "decode":
            raise ValueError(f"DecodeInstance: argument 'config' must have role 'decode', got {config.role!r}")
        self.engine = LLMEngine(config, runner, eos_token_ids, vocab_size, make_output_processor,
                                trace_hook=trace_hook, make_scheduler=DecodeScheduler)
        self.scheduler: DecodeScheduler = self.engine.scheduler
        self.kv, self.transport = kv, transport
        self.clock = clock if clock is not None else MonotonicClock()
        self.waits = PendingWaits(self.clock, deadlines if deadlines is not None else HandoffDeadlines())
        self.config_hash = instance_config_hash(config, vocab_size)
        self.k = config.num_speculative_tokens
        self.idle_poll_s = idle_poll_s
        self._prefill_addr: dict[str, str | None] = {}   # every unfinished request -> its P's connector
        self._done: list[Request] = []
        self._num_received = self._kv_bytes_received = 0
        self._rejected: dict[str, int] = {}               # receipt refusals by PD_MTP_FLOW §5.2 check
        self._latencies: list[float] = []                 # reservation -> receipt, since the last report
        self._reserved_at: dict[str, float] = {}          # request -> when D sent its reservation

    # ---- the hosted surface ----

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    stop_seqs: tuple[tuple[int, ...], ...] = (), prompt: str | None = None,
                    disaggregate_info: dict | None = None) -> Request:
        """Validate and queue for D's blocks (DECODE_ALLOCATION deadline); ValueError on a bad request."""
        info = DisaggregateInfo.parse(disaggregate_info, request_id)
        if request_id in self._prefill_addr:
            raise ValueError(f"DecodeInstance.add_request: argument 'request_id' {request_id!r} is already in use")
        request = self.engine.make_request(request_id, prompt_token_ids, params, stop_seqs, prompt)
        request.pd_timings = PDTimings(arrival_s=time.perf_counter())
        self._prefill_addr[request_id] = info.prefill_addr
        self.scheduler.add_pending(request)
        self.waits.start(request_id, WaitKind.DECODE_ALLOCATION)
        return request

    def abort(self, request_id: str, error: str | None = None) -> bool:
        """Stop the request and free what it holds; it is reported by the next `step()`. A hand-off that
        arrives for it later is acknowledged and dropped."""
        if request_id not in self._prefill_addr:
            return False
        error = error or f"PD: request {request_id} was aborted on D"
        request = self.scheduler.find_queued(request_id)
        if request is None:             # in a slot
            return self.engine.abort(request_id, error)
        self.waits.finish(request_id)
        self.scheduler.finish(request, FINISH_REASON_FAILED, error)
        self._done.append(request)
        return True

    def step(self, max_wait_s: float | None = None) -> list[Request]:
        """One step; with nothing to compute and hand-offs awaited, the first poll waits up to `max_wait_s`
        (default: the instance's idle poll) instead of spinning. Returns the requests finished or failed."""
        self._expire_waits()
        self._reserve()
        idle = not self.scheduler.has_unfinished() and self.scheduler.reserved
        self._receive((self.idle_poll_s if max_wait_s is None else max_wait_s) if idle else 0.0)
        if self.engine.has_unfinished():
            self._done.extend(self.engine.step())
        done, self._done = self._done, []
        now = time.perf_counter()
        for request in done:
            request.pd_timings.finished_s = now
            self._prefill_addr.pop(request.request_id, None)
            self._reserved_at.pop(request.request_id, None)
        return done

    def has_unfinished(self) -> bool:
        return bool(self.engine.has_unfinished() or self.scheduler.num_waiting_on_peer or self._done)

    def has_peer_waits(self) -> bool:
        return len(self.waits) > 0

    def close(self) -> None:
        """Release the connector (its sockets, for a process-to-process transport); the instance is done."""
        self.transport.close()

    def describe(self) -> dict:
        """What the router pairs on (SERVICES §5): the role, the connector address and the PD_MTP_FLOW §3 hash."""
        return {"role": "decode", "connector_addr": self.transport.address, "config_hash": self.config_hash}

    def pd_counters(self) -> dict:
        """SERVICES §4 PD metrics of D: hand-offs received, KV bytes received, refusals (connector and receipt,
        cumulative), and the reservation-to-receipt latencies observed since the previous call."""
        latencies, self._latencies = self._latencies, []
        return {"handoffs_received": self._num_received, "kv_bytes_received": self._kv_bytes_received,
                "refused": {**self.transport.refused_counts(), **self._rejected}, "handoff_latency_s": latencies}

    def stats(self) -> ResourceStats:
        return self.engine.stats()

    def num_waiting(self) -> int:
        """Requests without a slot yet: queued for blocks, reserved (P computes them), prefilled, or preempted."""
        return self.engine.num_waiting() + self.scheduler.num_waiting_on_peer + len(self.scheduler.prefilled)

    # ---- the connector, D side ----

    def _reserve(self) -> None:
        """Reserve blocks for the oldest pending requests (FIFO) and tell their P (SERVICES §6 step 2)."""
        while (request := self.scheduler.reserve_next()) is not None:
            rid = request.request_id
            try:
                self.transport.reserve(rid, self._prefill_addr[rid])
            except TransportFullError:
                self.scheduler.unreserve(request)
                return
            self.waits.finish(rid)
            self.waits.start(rid, WaitKind.PREFILL_RESULT)
            self._reserved_at[rid] = time.perf_counter()

    def _receive(self, wait_s: float) -> None:
        """Every delivered hand-off: PD_MTP_FLOW §5.2 checks, then insert / finish / fail; always acknowledged. A
        hand-off for a request D no longer awaits (failed, aborted) is dropped: its blocks are gone."""
        deadline = Deadline.after(self.clock, wait_s) if wait_s > 0 else None
        while (envelope := self.transport.poll(deadline)) is not None:
            deadline = None
            rid = envelope.request_id
            request = self.scheduler.reserved.get(rid)
            if request is None:
                logger.warning("PD decode: hand-off for request %s dropped: D does not await it", rid)
            else:
                verdict = Reject(rid, ReceiptCheck.INTEGRITY,
                                 f"PD: request {rid}: corrupted/mismatched hand-over: {envelope.error}") \
                    if envelope.error is not None else \
                    receive_handoff(rid, envelope.payload, config_hash=self.config_hash,
                                    num_speculative_tokens=self.k, kv_layout=self.kv.layout)
                self.waits.finish(rid)
                self._num_received += 1
                self._latencies.append(time.perf_counter() - self._reserved_at.pop(rid))
                if isinstance(verdict, Insert):
                    message = verdict.message
                    self._kv_bytes_received += sum(a.nbytes for a in message.kv_target + message.kv_mtp)
                    self.kv.write_prompt_kv(request.block_ids, message.kv_target, message.kv_mtp)
                    request.pd_timings.decode_start_s = time.perf_counter()
                    self.scheduler.add_prefilled(request, message.t0, message.draft_token_ids, message.sampling)
                elif isinstance(verdict, FinishAtReceipt):
                    request.output_token_ids = list(verdict.token_ids)
                    self._finish_queued(request, verdict.finish_reason, None)
                else:   # Reject
                    reason = verdict.check.name.lower()
                    self._rejected[reason] = self._rejected.get(reason, 0) + 1
                    self._finish_queued(request, verdict.finish_reason, verdict.error)
            self.transport.ack(rid)

    def _expire_waits(self) -> None:
        for wait in self.waits.pop_expired():
            request = self.scheduler.find_queued(wait.request_id)
            if request is not None:
                self._finish_queued(request, FINISH_REASON_FAILED, wait.error)

    def _finish_queued(self, request: Request, reason: str, error: str | None) -> None:
        """A request without a slot (at receipt, or failed waiting) ends: its reservation is freed."""
        self.scheduler.finish(request, reason, error)
        self._done.append(request)
