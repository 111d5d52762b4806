"""PD disaggregation in one process: a prefill engine P and a decode engine D joined by the P→D connector.

PD_MTP_FLOW §2–§7 and docs/design.md §4 ("How the engine calls it") and "PD". P and D are ordinary LLMEngines
(roles "prefill" and "decode"); `PDEngine` adds what neither has alone:

* the router: D preallocates a request's KV blocks (positions 0..L + 2K + 2, §5.1) before P is given it;
* P's hand-off of [t0] / [t0, d1] with the prompt's target and MTP KV, P's blocks held until D acknowledges;
* D's receipt checks (§5.2, `receive_handoff`), the KV scatter, and the queue of requests waiting for a slot;
* every cross-instance wait with its deadline and reclaim path (I10).

Nothing here imports paddle: the KV moves through the `KVPort` each side's entry point provides.
"""
from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from fastdeploy.config import FDConfig
from fastdeploy.engine.engine import LLMEngine
from fastdeploy.engine.request import PDTimings, Request, RequestStatus
from fastdeploy.engine.resource_manager import ResourceManager
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.step_io import DecodeTask, StepPlan
from fastdeploy.splitwise import (
    FINISH_REASON_FAILED,
    Clock,
    Deadline,
    FinishAtReceipt,
    HandoffDeadlines,
    HandoffMessage,
    HandoffSamplingParams,
    HandoffTransport,
    Insert,
    KVLayout,
    MonotonicClock,
    PendingWaits,
    TransportFullError,
    WaitKind,
    config_hash,
    receive_handoff,
)


# How long an idle D waits for a hand-off in one step (the clock's wait: real time, or virtual time in tests).
IDLE_POLL_S = 0.01


class KVPort(Protocol):
    """One instance's KV cache as the hand-off sees it (fastdeploy/worker/kv_transfer.py)."""

    layout: KVLayout

    def read_prompt_kv(self, block_ids: Sequence[int],
                       num_tokens: int) -> tuple[list[np.ndarray], list[np.ndarray]]: ...

    def write_prompt_kv(self, block_ids: Sequence[int], kv_target: Sequence[np.ndarray],
                        kv_mtp: Sequence[np.ndarray]) -> None: ...


def instance_config_hash(config: FDConfig, vocab_size: int) -> str:
    """The §3 compatibility hash of one instance: P's and D's must be equal."""
    k = config.num_speculative_tokens
    return config_hash(model_name=config.model, vocab_size=vocab_size, num_speculative_tokens=k,
                       mtp_model=f"{config.model}/mtp" if k else None, block_size=config.cache.block_size,
                       kv_dtype=config.dtype)


@dataclass(slots=True)
class _HeldBlocks:
    """P's blocks behind a sent hand-off, owned until D acknowledges it or the KV_TRANSFER deadline passes.
    Shaped like a request without a slot so that `ResourceManager.release` stays the only release path."""

    block_ids: list[int]
    slot: None = None


class DecodeScheduler(Scheduler):
    """D's scheduler: requests whose prompt P computed enter through `add_prefilled` and take a free slot with a
    DecodeTask (§5.3); their blocks were preallocated and already hold P's KV. A preempted request is recomputed
    locally as a prefill of prompt + outputs, like on a single instance (§7.2; flow spec §12.2)."""

    def __init__(self, config: FDConfig, resources: ResourceManager):
        super().__init__(config, resources)
        self.prefilled: deque[tuple[Request, tuple[int, ...]]] = deque()

    def add_prefilled(self, request: Request, draft_token_ids: tuple[int, ...]) -> None:
        self.prefilled.append((request, draft_token_ids))

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or bool(self.prefilled)

    def _top_up_decoders(self, plan: StepPlan) -> int:
        # Inserted slots decode from this step on, so they are admitted before the decoders' budget is counted.
        self._admit_prefilled(plan)
        return super()._top_up_decoders(plan)

    def _admit_prefilled(self, plan: StepPlan) -> None:
        budget = self.token_budget - len(self._decoding()) * (self.k + 1)
        while self.prefilled and self.resources.can_allocate_slot() and (budget >= self.k + 1
                                                                          or not self.running):
            request, draft_token_ids = self.prefilled.popleft()
            self.resources.allocate_slot(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self.running.sort(key=lambda r: r.arrival)
            plan.decode_tasks.append(DecodeTask(slot=request.slot, prompt_len=len(request.prompt_token_ids),
                                                draft_token_ids=draft_token_ids,
                                                block_ids=tuple(request.block_ids), sampling=self._sampling(request)))
            budget -= self.k + 1


class PDEngine:
    """Steps P and D in one loop. `prefill` must be built with a PrefillTokenProcessor (its `hand_off` is bound
    here), `decode` with a DecodeScheduler. Both sides share `transport` and `clock`."""

    def __init__(self, prefill: LLMEngine, decode: LLMEngine, prefill_kv: KVPort, decode_kv: KVPort,
                 transport: HandoffTransport, clock: Clock | None = None,
                 deadlines: HandoffDeadlines | None = None):
        if prefill.config.role != "prefill" or decode.config.role != "decode":
            raise ValueError(f"PDEngine: arguments 'prefill' and 'decode' must have roles prefill and decode, got "
                             f"{prefill.config.role} and {decode.config.role}")
        if not isinstance(decode.scheduler, DecodeScheduler):
            raise ValueError("PDEngine: argument 'decode' must be built with make_scheduler=DecodeScheduler")
        self.prefill, self.decode = prefill, decode
        self.prefill_kv, self.decode_kv = prefill_kv, decode_kv
        self.transport = transport
        self.clock = clock if clock is not None else MonotonicClock()
        deadlines = deadlines if deadlines is not None else HandoffDeadlines()
        self.prefill_waits = PendingWaits(self.clock, deadlines)   # KV_TRANSFER
        self.decode_waits = PendingWaits(self.clock, deadlines)    # DECODE_ALLOCATION, PREFILL_RESULT
        self.prefill_hash = instance_config_hash(prefill.config, prefill.vocab_size)
        self.decode_hash = instance_config_hash(decode.config, decode.vocab_size)
        self.k = decode.config.num_speculative_tokens
        prefill.output_processor.hand_off = self.hand_off
        self._unassigned: deque[Request] = deque()       # D's copies, until D has preallocated (router)
        self._awaiting: dict[str, Request] = {}            # D preallocated, hand-off not yet received
        self._held: dict[str, _HeldBlocks] = {}            # P's blocks until D's ack
        self._outbox: deque[tuple[str, bytes]] = deque()   # encoded hand-offs the full transport refused
        self._cancelled: set[str] = set()                  # failed before P handed them over
        self._live: dict[str, Request] = {}                # D's object of every unfinished request, by id
        self._num_finished = 0
        self._arrivals = itertools.count()

    # ---- client side ----

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    stop_seqs: tuple[tuple[int, ...], ...] = (), prompt: str | None = None) -> Request:
        """Validate on both instances and queue for assignment; a bad request raises ValueError, nothing held."""
        if request_id in self._live:
            raise ValueError(f"PDEngine.add_request: argument 'request_id' {request_id!r} is already in use")
        request = Request(request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params,
                          eos_token_ids=self.decode.eos_token_ids + tuple(
                              t for t in params.stop_token_ids if t not in self.decode.eos_token_ids),
                          stop_seqs=tuple(tuple(s) for s in stop_seqs), arrival=next(self._arrivals), prompt=prompt,
                          pd_timings=PDTimings(arrival_s=time.perf_counter()))
        self.prefill._validate(request)
        self.decode._validate(request)
        self._live[request_id] = request
        self._unassigned.append(request)
        self.decode_waits.start(request_id, WaitKind.DECODE_ALLOCATION)
        return request

    def has_unfinished(self) -> bool:
        return bool(self._unassigned or self._awaiting or self._held or self._outbox
                    or self.prefill.has_unfinished() or self.decode.has_unfinished()
                    or self.transport.num_in_flight() or self.transport.num_pending_acks())

    def has_peer_waits(self) -> bool:
        """True while some request waits on the other instance (progress then comes from a deadline)."""
        return bool(len(self.prefill_waits) or len(self.decode_waits) or self.transport.num_in_flight())

    @property
    def num_finished(self) -> int:
        """Requests finished or failed so far, on D or at receipt (a monotone progress count, engine/watchdog.py)."""
        return self._num_finished

    def step(self) -> list[Request]:
        """One step of both instances; returns the requests that finished or failed in it (D's objects)."""
        done: list[Request] = []
        self._expire_decode_waits(done)
        self._assign()
        self._reclaim_prefill_blocks()
        if self.prefill.has_unfinished():
            self.prefill.step()
        self._flush_outbox()      # this step's hand-offs reach D in this step
        self._receive(done, block=not (self.decode.has_unfinished() or self._outbox))
        if self.decode.has_unfinished():
            done.extend(self.decode.step())
        now = time.perf_counter()
        for request in done:
            request.pd_timings.finished_s = now
            del self._live[request.request_id]
        self._num_finished += len(done)
        return done

    # ---- router ----

    def _assign(self) -> None:
        """FIFO: D reserves positions 0..L + 2K + 2 (§5.1), then P gets the request. That is the spec's SHOULD,
        required here: D's first round has no stage 10 before it, and its MTP chain writes up to position L + K,
        so the slot must enter it holding the block row Park demands of every decoding slot (dec + 2K + 2). At
        most as many requests wait for their hand-off as D has slots, so D's pool is not hoarded."""
        resources = self.decode.resources
        while self._unassigned and len(self._awaiting) < resources.num_slots:
            request = self._unassigned[0]
            if not resources.grow_blocks(request, len(request.prompt_token_ids) + 2 * self.k + 3):
                return
            self._unassigned.popleft()
            rid = request.request_id
            self.decode_waits.finish(rid)
            self.decode_waits.start(rid, WaitKind.PREFILL_RESULT)
            self._awaiting[rid] = request
            request.pd_timings.prefill_start_s = time.perf_counter()
            self.prefill.add_request(rid, list(request.prompt_token_ids), request.params, request.stop_seqs,
                                     prompt=request.prompt)

    # ---- P side ----

    def hand_off(self, request: Request, entry: tuple[int, ...]) -> None:
        """P's token processor, entry [t0] / [t0, d1] (§4.4): take the request's blocks, send the hand-off. The
        KV is skipped when t0 terminates the request (D finishes it at receipt), and P's blocks are then freed
        at once; otherwise they are held until D acknowledges (KV_TRANSFER deadline)."""
        rid, t0 = request.request_id, entry[0]
        held = _HeldBlocks(request.block_ids)
        request.block_ids = []
        if rid in self._cancelled:
            self._cancelled.discard(rid)
            self.prefill.resources.release(held)
            return
        self._awaiting[rid].pd_timings.first_token_s = time.perf_counter()
        terminates = t0 in request.eos_token_ids or request.params.max_tokens <= 1
        length = len(request.prompt_token_ids)
        kv_target, kv_mtp = ([], []) if terminates else self.prefill_kv.read_prompt_kv(held.block_ids, length)
        params = request.params
        message = HandoffMessage.create(
            request_id=rid, prompt_token_ids=request.prompt_token_ids,
            sampling=HandoffSamplingParams(max_tokens=params.max_tokens, min_tokens=params.min_tokens,
                                           stop_seqs=request.stop_seqs, eos_token_ids=request.eos_token_ids,
                                           temperature=params.temperature, top_p=params.top_p,
                                           seed=request.seed),
            t0=t0, draft_token_ids=entry, kv_target=kv_target, kv_mtp=kv_mtp, config_hash=self.prefill_hash)
        if terminates:
            self.prefill.resources.release(held)
        else:
            self._held[rid] = held
            self.prefill_waits.start(rid, WaitKind.KV_TRANSFER)
        self._outbox.append((rid, message.encode()))

    def _flush_outbox(self) -> None:
        """Send in order; a full transport keeps the rest for the next step (bounded by KV_TRANSFER)."""
        while self._outbox:
            rid, payload = self._outbox[0]
            try:
                self.transport.send(rid, payload)
            except TransportFullError:
                return
            self._outbox.popleft()

    def _reclaim_prefill_blocks(self) -> None:
        while (rid := self.transport.poll_ack()) is not None:
            if self.prefill_waits.finish(rid) is not None:
                self.prefill.resources.release(self._held.pop(rid))
        for wait in self.prefill_waits.pop_expired():
            self.prefill.resources.release(self._held.pop(wait.request_id))
            self._outbox = deque(item for item in self._outbox if item[0] != wait.request_id)

    # ---- D side ----

    def _receive(self, done: list[Request], block: bool) -> None:
        """Every delivered hand-off: §5.2 checks, then insert / finish / fail; always acknowledged. A hand-off
        for a request D already gave up on is dropped (its blocks are gone). With `block` (D has nothing to
        compute) and hand-offs awaited, the first poll waits up to IDLE_POLL_S instead of spinning."""
        deadline = Deadline.after(self.clock, IDLE_POLL_S) if block and self._awaiting else None
        while (envelope := self.transport.poll(deadline)) is not None:
            deadline = None
            rid = envelope.request_id
            verdict = receive_handoff(rid, envelope.payload, config_hash=self.decode_hash,
                                      num_speculative_tokens=self.k, kv_layout=self.decode_kv.layout)
            if self.decode_waits.finish(rid) is not None:
                request = self._awaiting.pop(rid)
                if isinstance(verdict, Insert):
                    self._insert(request, verdict.message)
                elif isinstance(verdict, FinishAtReceipt):
                    request.output_token_ids = list(verdict.token_ids)
                    self._end(request, verdict.finish_reason, None, done)
                else:   # Reject
                    self._end(request, verdict.finish_reason, verdict.error, done)
            self.transport.ack(rid)

    def _insert(self, request: Request, message: HandoffMessage) -> None:
        """Write P's KV into the preallocated blocks and queue the request for a slot, with exactly the sampling
        values P used (§3)."""
        self.decode_kv.write_prompt_kv(request.block_ids, message.kv_target, message.kv_mtp)
        sampling = message.sampling
        request.params = replace(request.params, temperature=sampling.temperature, top_p=sampling.top_p,
                                 max_tokens=sampling.max_tokens, min_tokens=sampling.min_tokens, seed=sampling.seed)
        request.seed = sampling.seed
        request.eos_token_ids = sampling.eos_token_ids
        request.stop_seqs = sampling.stop_seqs
        request.output_token_ids = [message.t0]
        request.prefill_len = request.num_computed_tokens = len(request.prompt_token_ids)
        request.pd_timings.decode_start_s = time.perf_counter()
        self.decode.scheduler.add_prefilled(request, message.draft_token_ids)

    def _expire_decode_waits(self, done: list[Request]) -> None:
        for wait in self.decode_waits.pop_expired():
            rid = wait.request_id
            if wait.kind is WaitKind.DECODE_ALLOCATION:
                request = next(r for r in self._unassigned if r.request_id == rid)
                self._unassigned.remove(request)
            else:
                request = self._awaiting.pop(rid)
                self._cancel_on_prefill(rid)
            self._end(request, FINISH_REASON_FAILED, wait.error, done)

    def _cancel_on_prefill(self, rid: str) -> None:
        """D gave up before the hand-off: drop the request on P if it is still queued there; if P is computing it,
        its hand-off is dropped and P's blocks freed when it completes."""
        queued = next((r for r in self.prefill.scheduler.waiting if r.request_id == rid), None)
        if queued is not None:
            self.prefill.scheduler.waiting.remove(queued)
        elif any(r.request_id == rid for r in self.prefill.scheduler.running):
            self._cancelled.add(rid)

    def _end(self, request: Request, reason: str, error: str | None, done: list[Request]) -> None:
        """Finish a request that holds no D slot (at receipt, or failed): free its preallocated blocks."""
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.error = error
        self.decode.resources.release(request)
        done.append(request)
