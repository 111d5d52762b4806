"""The prefill instance P of a PD pair: an LLMEngine that computes prompts D has reserved and hands them off.

PD_MTP_FLOW §4 and SERVICES §6 steps 3–4. P starts a request only once both the request and D's reservation for
its id are present (either may come first; an unmatched one expires after the RESERVATION deadline, and an
expired request fails with an error for its client). P's token processor calls `hand_off` with [t0] / [t0, d1]:
P reads the prompt's KV through its KV port, sends the hand-off, and holds the blocks until D acknowledges it or
the KV_TRANSFER deadline passes. It talks to D only through the `HandoffTransport`; nothing here imports paddle.

`step()` reports each request once: finish reason "handed_off" when its hand-off was sent (D's stream carries the
output), "abort" with `error` when it failed or was aborted on P.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from fastdeploy.config import FDConfig
from fastdeploy.engine.engine import LLMEngine, ModelRunner, OutputProcessor, StepTrace
from fastdeploy.engine.pd_connector import IDLE_POLL_S, DisaggregateInfo, KVPort, instance_config_hash
from fastdeploy.engine.request import PDTimings, Request, RequestStatus
from fastdeploy.engine.resource_manager import ResourceManager, ResourceStats
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.splitwise import (
    FINISH_REASON_FAILED,
    Clock,
    Deadline,
    HandoffDeadlines,
    HandoffMessage,
    HandoffSamplingParams,
    HandoffTransport,
    MonotonicClock,
    Payload,
    PendingWaits,
    TransportFullError,
    WaitKind,
)

logger = logging.getLogger(__name__)

HandOff = Callable[[Request, tuple[int, ...]], None]
# Builds P's token processor around the instance's hand-off (fastdeploy/output/prefill_token_processor.py).
MakePrefillProcessor = Callable[[Scheduler, ResourceManager, HandOff], OutputProcessor]


@dataclass(slots=True)
class _Outgoing:
    request: Request
    payload: Payload


class PrefillInstance:
    def __init__(self, config: FDConfig, runner: ModelRunner, eos_token_ids: tuple[int, ...], vocab_size: int,
                 make_output_processor: MakePrefillProcessor, kv: KVPort, transport: HandoffTransport,
                 clock: Clock | None = None, deadlines: HandoffDeadlines | None = None,
                 trace_hook: Callable[[StepTrace], None] | None = None, idle_poll_s: float = IDLE_POLL_S):
        if config.role != "prefill":
            raise ValueError(f"PrefillInstance: argument 'config' must have role 'prefill', got {config.role!r}")
        self.engine = LLMEngine(config, runner, eos_token_ids, vocab_size,
                                lambda scheduler, resources: make_output_processor(scheduler, resources,
                                                                                   self.hand_off),
                                trace_hook=trace_hook)
        self.kv, self.transport = kv, transport
        self.clock = clock if clock is not None else MonotonicClock()
        self.waits = PendingWaits(self.clock, deadlines if deadlines is not None else HandoffDeadlines())
        self.config_hash = instance_config_hash(config, vocab_size)
        self.idle_poll_s = idle_poll_s
        self._unmatched: dict[str, Request] = {}      # request present, D's reservation not yet
        self._reserved: set[str] = set()              # D's reservation present, request not yet
        self._live: dict[str, Request] = {}           # in P's scheduler, not yet handed off
        self._held: dict[str, list[int]] = {}         # blocks behind a sent hand-off, until D's ack
        self._outbox: deque[_Outgoing] = deque()      # hand-offs a full transport refused so far
        self._done: list[Request] = []
        self._num_sent = self._kv_bytes_sent = self._num_send_failed = 0

    # ---- the hosted surface ----

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    stop_seqs: tuple[tuple[int, ...], ...] = (), prompt: str | None = None,
                    disaggregate_info: dict | None = None) -> Request:
        """Validate; start at once if D's reservation is here, else hold it (RESERVATION deadline)."""
        DisaggregateInfo.parse(disaggregate_info, request_id)
        if self._knows(request_id):
            raise ValueError(f"PrefillInstance.add_request: argument 'request_id' {request_id!r} is already in use")
        request = self.engine.make_request(request_id, prompt_token_ids, params, stop_seqs, prompt)
        request.pd_timings = PDTimings(arrival_s=time.perf_counter())
        if request_id in self._reserved:
            self._reserved.discard(request_id)
            self.waits.finish(request_id)
            self._start(request)
        else:
            self._unmatched[request_id] = request
            self.waits.start(request_id, WaitKind.RESERVATION)
        return request

    def abort(self, request_id: str, error: str | None = None) -> bool:
        """Stop the request wherever it is on P and free what it holds; it is reported by the next `step()`.
        False when P has nothing under that id (e.g. already handed off)."""
        error = error or f"PD: request {request_id} was aborted on P"
        if request_id in self._reserved:           # a reservation alone: no client on P to tell
            self._reserved.discard(request_id)
            self.waits.finish(request_id)
            return True
        request = self._unmatched.pop(request_id, None)
        if request is not None:
            self.waits.finish(request_id)
            self._fail(request, error)
            return True
        if request_id not in self._live or not self.engine.abort(request_id, error):
            return False
        request = self._live[request_id]
        if request.status is RequestStatus.FINISHED:    # it was still queued: finished at once
            del self._live[request_id]
            self._done.append(request)
        return True                                     # in a slot: reported when its preemption (-9) is

    def step(self) -> list[Request]:
        """One step. With nothing to compute or send, the first poll for the awaited reservation (or else ack)
        waits up to `idle_poll_s` instead of spinning."""
        wait_s = 0.0 if self.has_prefill_work() else self.idle_poll_s
        self._match_reservations(wait_s if self._unmatched else 0.0)
        self._reclaim_blocks(wait_s if self._held and not self._unmatched else 0.0)
        if self.engine.has_unfinished():
            for request in self.engine.step():
                self._live.pop(request.request_id, None)
                if request.finish_reason == FINISH_REASON_FAILED:    # aborted (-9) or stopped by recovery (-3)
                    self._done.append(request)
        self._flush_outbox()
        done, self._done = self._done, []
        return done

    def has_unfinished(self) -> bool:
        return bool(self.engine.has_unfinished() or self._unmatched or self._reserved or self._held
                    or self._outbox or self._done)

    def has_prefill_work(self) -> bool:
        """Whether the next step computes or sends something (unlike waits, which only a deadline ends)."""
        return bool(self.engine.has_unfinished() or self._outbox)

    def has_peer_waits(self) -> bool:
        return len(self.waits) > 0

    def close(self) -> None:
        """Release the connector (its sockets, for a process-to-process transport); the instance is done."""
        self.transport.close()

    def describe(self) -> dict:
        """What the router pairs on (SERVICES §5): the role, the connector address and the PD_MTP_FLOW §3 hash."""
        return {"role": "prefill", "connector_addr": self.transport.address, "config_hash": self.config_hash}

    def pd_counters(self) -> dict:
        """SERVICES §4 PD metrics of P (cumulative): hand-offs sent, KV bytes sent, hand-offs given up unsent,
        refusals, held blocks."""
        return {"handoffs_sent": self._num_sent, "kv_bytes_sent": self._kv_bytes_sent,
                "send_failed": self._num_send_failed, "refused": self.transport.refused_counts(),
                "held_blocks": self.num_held_blocks}

    def stats(self) -> ResourceStats:
        return self.engine.stats()

    def num_waiting(self) -> int:
        """Requests P holds but does not compute yet: queued, or waiting for D's reservation."""
        return self.engine.num_waiting() + len(self._unmatched)

    @property
    def num_held_blocks(self) -> int:
        return sum(len(b) for b in self._held.values())

    @property
    def num_unsent_handoffs(self) -> int:
        return len(self._outbox)

    # ---- the connector, P side ----

    def hand_off(self, request: Request, entry: tuple[int, ...]) -> None:
        """P's token processor, entry [t0] / [t0, d1] (PD_MTP_FLOW §4.4): take the request's blocks and queue the
        hand-off. The KV is skipped when t0 terminates the request (D finishes it at receipt) and P's blocks are
        freed at once; otherwise they are held until D acknowledges (KV_TRANSFER deadline)."""
        rid, t0 = request.request_id, entry[0]
        self._live.pop(rid, None)
        blocks = self.engine.resources.take_blocks(request)
        request.pd_timings.first_token_s = time.perf_counter()
        terminates = t0 in request.eos_token_ids or request.params.max_tokens <= 1
        length = len(request.prompt_token_ids)
        kv_target, kv_mtp = ([], []) if terminates else self.kv.read_prompt_kv(blocks, length)
        params = request.params
        message = HandoffMessage.create(
            request_id=rid, prompt_token_ids=request.prompt_token_ids,
            sampling=HandoffSamplingParams(max_tokens=params.max_tokens, min_tokens=params.min_tokens,
                                           stop_seqs=request.stop_seqs, eos_token_ids=request.eos_token_ids,
                                           temperature=params.temperature, top_p=params.top_p,
                                           seed=request.seed),
            t0=t0, draft_token_ids=entry, kv_target=kv_target, kv_mtp=kv_mtp, config_hash=self.config_hash)
        if terminates:
            self.engine.resources.release_blocks(blocks)
        else:
            self._held[rid] = blocks
        self.waits.start(rid, WaitKind.KV_TRANSFER)     # ends at D's ack, which comes for every hand-off
        self._outbox.append(_Outgoing(request, message.encode_frames()))

    def _start(self, request: Request) -> None:
        request.pd_timings.prefill_start_s = time.perf_counter()
        self._live[request.request_id] = request
        self.engine.submit(request)

    def _match_reservations(self, wait_s: float) -> None:
        deadline = Deadline.after(self.clock, wait_s) if wait_s > 0 else None
        while (rid := self.transport.poll_reservation(deadline)) is not None:
            deadline = None
            request = self._unmatched.pop(rid, None)
            if request is not None:
                self.waits.finish(rid)
                self._start(request)
            elif self._knows(rid) or rid in self._reserved:
                logger.warning("PD prefill: duplicate reservation for request %s ignored", rid)
            else:
                self._reserved.add(rid)
                self.waits.start(rid, WaitKind.RESERVATION)

    def _reclaim_blocks(self, wait_s: float) -> None:
        deadline = Deadline.after(self.clock, wait_s) if wait_s > 0 else None
        while (rid := self.transport.poll_ack(deadline)) is not None:
            deadline = None
            if self.waits.finish(rid) is not None:
                self.engine.resources.release_blocks(self._held.pop(rid, []))
        for wait in self.waits.pop_expired():
            rid = wait.request_id
            if wait.kind is WaitKind.KV_TRANSFER:
                self.engine.resources.release_blocks(self._held.pop(rid, []))
                unsent = next((item for item in self._outbox if item.request.request_id == rid), None)
                if unsent is not None:
                    self._outbox.remove(unsent)
                    self._num_send_failed += 1
                    self._fail(unsent.request, wait.error)
            elif rid in self._unmatched:
                self._fail(self._unmatched.pop(rid), wait.error)
            else:
                self._reserved.discard(rid)
                logger.warning("PD prefill: reservation for request %s dropped: no request came within %g s",
                               rid, wait.timeout_s)

    def _flush_outbox(self) -> None:
        """Send in order; a full transport keeps the rest for the next step (bounded by KV_TRANSFER)."""
        while self._outbox:
            item = self._outbox[0]
            try:
                self.transport.send(item.request.request_id, item.payload)
            except TransportFullError:
                return
            self._outbox.popleft()
            self._done.append(item.request)
            self._num_sent += 1
            self._kv_bytes_sent += sum(memoryview(frame).nbytes for frame in item.payload[1:])

    def _fail(self, request: Request, error: str) -> None:
        request.status = RequestStatus.FINISHED
        request.finish_reason = FINISH_REASON_FAILED
        request.error = error
        self._done.append(request)

    def _knows(self, request_id: str) -> bool:
        """The id is taken by a request on P (a bare reservation does not count)."""
        return (request_id in self._unmatched or request_id in self._live or request_id in self._held
                or any(i.request.request_id == request_id for i in self._outbox))
