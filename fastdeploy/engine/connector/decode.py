"""The decode role's connector: D reserves a slot and blocks for a request, tells P, and takes in P's hand-off.

PD_MTP_FLOW §5 and SERVICES §6 steps 2 and 5. A request waits in the scheduler's queue for D's slot and blocks
(DECODE_ALLOCATION); the scheduler gives it the slot and positions 0..L + 2K + 2 (PD_MTP_FLOW §5.1) and calls
`on_allocated`, which sends the reservation to P; the request then waits for P's hand-off (PREFILL_RESULT). On
receipt the PD_MTP_FLOW §5.2 checks run, P's KV goes into the request's blocks through the worker half, and the
scheduler queues its first round (`on_prefilled`) — or finishes it at receipt. Every hand-off is acknowledged. Over
a streaming transport (ZeroMQ) D registers the request's blocks as its landing before reserving: the transport's
thread writes and hashes P's pieces there as they arrive and delivers the hand-off verified (kv_stream.py).
Because the slot is taken at reservation, running + reserved + received requests never exceed D's slots: a
saturated D makes new requests wait before their first token, never between tokens.

With a one-sided transfer engine (Mooncake), the reservation also says where the request's blocks lie, P writes
the KV straight into them, and the hand-off is its header alone; D verifies the tag over its own blocks. A request
that ends while P may still write into its blocks (it failed or was aborted before its hand-off came) keeps its
blocks in the resource manager, in quarantine under its id, until P's hand-off or refusal for it arrives, or until
no write of P's can still land: P writes only within PREFILL_RESULT of receiving the reservation, and the quarantine
lasts PREFILL_RESULT + KV_TRANSFER from the moment D gave up (docs/design.md §8). Both waits, here and on P, are
scaled by the hand-off's KV bytes at the floor rate (splitwise/deadline.py), which P and D compute alike from the
prompt positions D reserved.
"""
from __future__ import annotations

import logging
import time

import numpy as np
from msgspec.structs import replace

from fastdeploy.engine.connector.answering import AnsweringPeers
from fastdeploy.engine.connector.base import PDConnector
from fastdeploy.schema.request import FINISH_ABORT, PDTimings, Request, RequestIdInUseError, RequestStatus, TokenLogprob
from fastdeploy.splitwise import (
    FinishAtReceipt,
    Insert,
    ReceiptCheck,
    Reject,
    RequestExpectation,
    WaitKind,
    receive_handoff,
)
from fastdeploy.splitwise.handoff import HandoffSamplingParams
from fastdeploy.splitwise.kv_stream import Landing
from fastdeploy.splitwise.transport import Envelope
from fastdeploy.splitwise.wire import KV_DTYPES

logger = logging.getLogger(__name__)


class DecodeConnector(PDConnector):
    role, peer_role = "decode", "prefill"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._prefill_addr: dict[str, str | None] = {}   # every live request -> its P's connector
        self._reserved_at: dict[str, float] = {}          # request -> when its reservation was sent
        self._num_received = self._kv_bytes_received = 0
        self._rejected: dict[str, int] = {}               # receipt refusals by PD_MTP_FLOW §5.2 check
        self._latencies: list[float] = []                 # reservation -> receipt, since the last report
        self._quarantine: dict[str, float] = {}           # request whose blocks are kept -> clock time they come back
        self._transfers_done: list[str] = []              # quarantines over, not yet reported
        self._unreachable: dict[str, str] = {}            # request -> why P can never be told (failed at poll)
        self._staged: dict[str, np.ndarray] = {}          # request -> where its streamed KV lands (device cache)
        self._unready_since: dict[str, float] = {}        # P address not connected -> when a request first asked
        self._kv_bytes: dict[str, int] = {}               # every live request -> the KV bytes its hand-off moves
        self._answering = AnsweringPeers()                 # which P's answered: one probe to any other (answering.py)

    # ---- scheduler half ----

    def admit(self, request: Request, disaggregate_info: dict | None) -> RequestStatus:
        info = self.parse_info(request, disaggregate_info)
        if self.has_state(request.request_id):
            raise RequestIdInUseError(f"'request_id' {request.request_id!r} is already in use (P may still write "
                                      "into the blocks of its previous request)")
        if info.prefill_addr is None and self.transport.needs_peer_address:
            raise ValueError("disaggregate_info: field 'prefill_addr' is required on a decode instance (the "
                             "prefill instance's connector, 'host:port')")
        request.remote_prefill = True
        request.pd_timings = PDTimings(arrival_s=time.perf_counter())
        self._prefill_addr[request.request_id] = info.prefill_addr
        self.waits.start(request.request_id, WaitKind.DECODE_ALLOCATION)
        return RequestStatus.WAITING

    def on_allocated(self, request: Request) -> bool:
        """Tell P that the request's blocks are reserved (SERVICES §6 step 2). False when P's queue is full (the
        scheduler gives the slot and blocks back and retries later, admitting other P's requests meanwhile); any
        other failure to tell P fails this request alone, at the next poll."""
        rid = request.request_id
        kv_start, block_ids, _ = self._kv_part(request)
        nbytes = self._kv_bytes[rid] = self.handoff_kv_bytes(len(request.prompt_token_ids) - kv_start)
        try:
            data = {} if self.kv_transfer is None else self.kv_transfer.reservation_data(block_ids)
            if kv_start:
                data["kv_start"] = kv_start
            if self.kv_transfer is None and self.transport.streams_kv:
                self.transport.expect_kv(rid, self._landing(request))
            refused = self.transport.reserve(rid, self._prefill_addr[rid], data=data or None)
        except Exception as error:   # noqa: BLE001 - a P that cannot be told fails its request, never D
            self._release_landing(rid)
            self.count_transport_error("reserve", rid, error)
            self.waits.finish(rid)
            self._unreachable[rid] = f"PD: request {rid}: the prefill instance could not be told: {error}"
            return True
        if refused is not None:
            self._release_landing(rid)
            return False
        self.waits.finish(rid)
        acknowledged = self.transport.acknowledges_reservations
        self.waits.start(rid, WaitKind.RESERVATION_ACK if acknowledged else WaitKind.PREFILL_RESULT, nbytes)
        if acknowledged and self._prefill_addr[rid] is not None:
            self._answering.reserved(self._prefill_addr[rid], rid)
        self._reserved_at[rid] = self.clock.now()
        return True

    def peer_key(self, request: Request) -> object:
        return self._prefill_addr.get(request.request_id)

    def peer_ready(self, request: Request) -> bool:
        """Whether the request's P completed a connection (with a PD secret: proved it holds the secret) and may
        be given a slot: it answered a reservation, or none of its reservations awaits an answer (the probe,
        answering.py). Until then the request holds no slot and delays no other P's request; a P that does not
        complete a connection, or does not acknowledge its probe, within the reservation-ack deadline fails every
        request waiting for it at once (`poll`)."""
        addr = self._prefill_addr.get(request.request_id)
        if addr is None:
            return True
        if self.transport.peer_ready(addr):
            self._unready_since.pop(addr, None)
            return self._answering.may_reserve(addr)
        self._answering.disconnected(addr)
        self._unready_since.setdefault(addr, self.clock.now())
        return False

    def poll(self, wait_s: float) -> None:
        """P's answers first (hand-offs checked and acknowledged, acceptances of reservations noted), then expired
        waits fail their requests. The idle wait applies only while something awaits P."""
        for rid, error in list(self._unreachable.items()):
            request = self.scheduler.find(rid)
            del self._unreachable[rid]
            if request is not None:
                self.scheduler.finish(request, FINISH_ABORT, error)
        # the idle wait goes to P's next message; the engine passes 0 while it has work of its own, and a request
        # whose P's queue is full waits for that P's answers, so this wait never spins
        deadline = self.deadline(wait_s)
        while (envelope := self.transport.poll(deadline)) is not None:
            deadline = None
            self._take_in(envelope)
        for rid in self.transport.take_accepted():   # P has the reservation: now its hand-off is awaited
            self._p_answered(rid)
            if self.waits.finish(rid) is WaitKind.RESERVATION_ACK:
                self.waits.start(rid, WaitKind.PREFILL_RESULT, self._kv_bytes.get(rid, 0))
        for wait in self.waits.pop_expired():
            addr = self._prefill_addr.get(wait.request_id)
            request = self.scheduler.find(wait.request_id)
            if request is not None:
                self.scheduler.finish(request, FINISH_ABORT, self._expired_error(wait))
            if wait.kind is WaitKind.RESERVATION_ACK and addr is not None:
                self._fail_silent(addr)
        self._fail_unconnected()
        now = self.clock.now()
        for rid in [rid for rid, until in self._quarantine.items() if until <= now]:
            self._end_quarantine(rid)

    def request_finished(self, request: Request) -> bool:
        """Keeps the blocks (quarantine) of a request that ends while P may still write into them. A streamed
        hand-off's pieces are written by the transport's thread: once `release_kv` returns (after the piece being
        written, if any) nothing more lands in the blocks, so they go back with the slot."""
        rid = request.request_id
        self._release_landing(rid)
        self.waits.finish(rid)
        addr = self._prefill_addr.pop(rid, None)
        if addr is not None:
            self._answering.ended(addr, rid)
        nbytes = self._kv_bytes.pop(rid, 0)
        self.safe_forget(rid)
        reserved_at = self._reserved_at.pop(rid, None)
        request.pd_timings.finished_s = time.perf_counter()
        if reserved_at is None or self.kv_transfer is None:
            return False
        d = self.deadlines   # P's last write starts within its scaled PREFILL_RESULT and lasts its KV_TRANSFER
        self._quarantine[rid] = self.clock.now() + d.timeout_s(WaitKind.PREFILL_RESULT, nbytes) + \
            d.timeout_s(WaitKind.KV_TRANSFER, nbytes)
        return True

    def finished_transfers(self) -> list[str]:
        done, self._transfers_done = self._transfers_done, []
        return done

    def has_unfinished(self) -> bool:
        """Blocks in quarantine (P may still write into them), quarantines over but not yet reported, requests
        to fail at the next poll."""
        return bool(self._quarantine or self._transfers_done or self._unreachable)

    def has_state(self, rid: str) -> bool:
        """The id has connector state left: a live request, a wait, a reservation, blocks in quarantine."""
        return rid in self._prefill_addr or rid in self.waits or rid in self._reserved_at or rid in self._quarantine

    def describe_held(self) -> str:
        return f"blocks in quarantine for {sorted(self._quarantine)}" if self._quarantine else ""

    def counters(self) -> dict:
        """SERVICES §4 PD metrics of D: hand-offs received, KV bytes received, refusals (connector and receipt,
        cumulative), blocks in quarantine, and the reservation-to-receipt latencies observed since the previous
        call."""
        latencies, self._latencies = self._latencies, []
        return {"handoffs_received": self._num_received, "kv_bytes_received": self._kv_bytes_received,
                "transport_errors": self.num_transport_errors,
                "refused": {**self.transport.refused_counts(), **self._rejected},
                "handoff_latency_s": latencies}

    # ---- internals ----

    def _fail_unconnected(self) -> None:
        """Fail, all at once, the waiting requests of a P address that has not completed a connection within the
        reservation-ack deadline since a request first asked for it; a later request for it starts a new wait."""
        now, limit = self.clock.now(), self.deadlines.reservation_ack_s
        for addr in [a for a, since in self._unready_since.items() if now - since >= limit]:
            del self._unready_since[addr]
            self.transport.drop_peer(addr)
            why = (f"no prefill instance completed a connection at {addr} within {limit:g} s (is that a P's "
                   "--pd-comm-port, and does it hold the same PD secret?)")
            self._fail_waiting(addr, why)

    def _fail_silent(self, addr: str) -> None:
        """A reservation at `addr` went unacknowledged past its deadline although the connection completed: that
        P is silent. Every request waiting for it (no slot yet) fails at once; the next one probes it again."""
        self._answering.silent(addr)
        self._fail_waiting(addr, f"the prefill instance at {addr} completed a connection but acknowledged no "
                                 f"reservation within {self.deadlines.reservation_ack_s:g} s")

    def _fail_waiting(self, addr: str, why: str) -> None:
        for rid in [rid for rid, a in self._prefill_addr.items() if a == addr]:
            request = self.scheduler.find(rid)
            if request is not None and request.status is RequestStatus.WAITING:
                self.scheduler.finish(request, FINISH_ABORT, f"PD: request {rid}: {why}")

    def _p_answered(self, rid: str) -> None:
        """P answered the reservation of `rid` (acknowledged or refused it, or sent its hand-off)."""
        addr = self._prefill_addr.get(rid)
        if addr is not None:
            self._answering.answered(addr)

    def _expired_error(self, wait) -> str:
        if wait.kind is not WaitKind.RESERVATION_ACK:
            return wait.error
        return (f"{wait.error}: no prefill instance acknowledged the reservation at "
                f"{self._prefill_addr.get(wait.request_id)} (is that a P's --pd-comm-port?)")

    def _take_in(self, envelope: Envelope) -> None:
        """One delivered answer of P: checked, then acknowledged; an error fails its request, never D."""
        rid = envelope.request_id
        request = self.scheduler.peer_waiting.get(rid)
        if envelope.unsent:   # the reservation never reached P: nothing to check or acknowledge
            self._reserved_at.pop(rid, None)
            if request is not None:
                self.waits.finish(rid)
                self.scheduler.finish(request, FINISH_ABORT, f"PD: request {rid}: the prefill instance could not be "
                                                             f"told: {envelope.error}")
            return
        self._p_answered(rid)
        try:
            self._receive(envelope)
        except Exception as error:   # noqa: BLE001 - one bad hand-off fails its request, never the instance
            logger.exception("PD decode: hand-off for request %s failed", rid)
            if request is not None and request.status is not RequestStatus.FINISHED:   # wherever it got to
                self.scheduler.finish(request, FINISH_ABORT, f"PD: request {rid}: the hand-off could not be "
                                                             f"taken in: {error}")
        try:
            self.transport.ack(rid)
        except Exception as error:   # noqa: BLE001 - P frees its blocks at its deadline instead
            self.count_transport_error("ack", rid, error)

    def _receive(self, envelope: Envelope) -> None:
        """PD_MTP_FLOW §5.2 checks, then insert / finish / fail. A hand-off for a request D no longer awaits
        (failed, aborted) is dropped: its blocks are gone."""
        rid = envelope.request_id
        request = self.scheduler.peer_waiting.get(rid)
        if request is None:
            if rid in self._quarantine:     # P is done with the blocks of a request D gave up on
                self._end_quarantine(rid)
            logger.warning("PD decode: hand-off for request %s dropped: D does not await it", rid)
            return
        kv_start, block_ids, reused = self._kv_part(request)
        in_place = None if self.kv_transfer is None else self.kv_transfer.in_place(block_ids)
        verdict = Reject(rid, ReceiptCheck.INTEGRITY,
                         f"PD: request {rid}: corrupted/mismatched hand-over: {envelope.error}") \
            if envelope.error is not None else \
            receive_handoff(rid, envelope.payload, config_hash=self.config_hash,
                            num_speculative_tokens=self.scheduler.k, kv_layout=self.kv.layout,
                            key=self.transport.handoff_key, kv_in_place=in_place,
                            expect=_expectation(request, kv_start, reused), kv_landed=envelope.kv_landed)
        self.waits.finish(rid)
        self._num_received += 1
        self._latencies.append(self.clock.now() - self._reserved_at.pop(rid))
        verdict = _check_logprobs(request, verdict)
        if isinstance(verdict, Insert):
            message = verdict.message
            self._kv_bytes_received += message.kv_nbytes
            if message.kv_inline:
                self.kv.write_prompt_kv(block_ids, message.kv_target, message.kv_mtp)
            elif rid in self._staged:   # a streamed hand-off landed in host memory: one copy to the device
                self.kv.write_prompt_kv(block_ids, *_split(self._staged.pop(rid), message.kv_specs()))
            request.pd_timings.decode_start_s = time.perf_counter()
            self.scheduler.on_prefilled(request, message.t0, message.draft_token_ids, message.sampling.seed,
                                        _t0_logprob(request, message.t0_logprobs))
        elif isinstance(verdict, FinishAtReceipt):
            request.output_token_ids = list(verdict.token_ids)
            entry = _t0_logprob(request, verdict.t0_logprobs)
            request.output_logprobs = [entry] if entry is not None else []
            self.scheduler.finish(request, verdict.finish_reason)
        else:
            reason = verdict.check.name.lower()
            self._rejected[reason] = self._rejected.get(reason, 0) + 1
            request.pair_mismatch = verdict.check is ReceiptCheck.MISMATCH
            self.scheduler.finish(request, FINISH_ABORT, verdict.error)


    def _kv_part(self, request: Request) -> tuple[int, list[int], bytes]:
        """The part of the prompt's KV P sends: from which position (D's prefix cache holds the whole blocks before
        it: the scheduler shared them and set `num_computed_tokens`), into which of the request's blocks, and the
        keys of the blocks D reused (the hand-off's tag covers them, PD_MTP_FLOW §13.6)."""
        kv_start = request.num_computed_tokens
        skip = kv_start // self.resources.block_size
        return kv_start, request.block_ids[skip:], b"".join(request.block_keys[:skip])

    def _landing(self, request: Request) -> Landing:
        """Where the transport writes the request's streamed KV: its blocks, in place on a host cache; a staging
        buffer otherwise (written into the blocks at receipt)."""
        kv_start, block_ids, reused = self._kv_part(request)
        length = len(request.prompt_token_ids) - kv_start
        if self.kv.in_host_memory:
            return Landing(self.kv.prompt_kv_chunks(block_ids, length), reused, kv_start)
        specs = self.kv.placed_kv(length)
        staged = np.empty(sum(spec.nbytes for spec in specs.target + specs.mtp), np.uint8)
        self._staged[request.request_id] = staged
        return Landing([memoryview(staged)], reused, kv_start)

    def _release_landing(self, rid: str) -> None:
        self.transport.release_kv(rid)
        self._staged.pop(rid, None)

    def _end_quarantine(self, request_id: str) -> None:
        del self._quarantine[request_id]
        self._transfers_done.append(request_id)


def _split(staged: np.ndarray, specs: tuple) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The (target, MTP) arrays a staging buffer holds, back to back in the hand-off's order (views)."""
    groups, offset = ([], []), 0
    for group, group_specs in zip(groups, specs):
        for spec in group_specs:
            group.append(staged[offset:offset + spec.nbytes].view(KV_DTYPES[spec.dtype]).reshape(spec.shape))
            offset += spec.nbytes
    return groups


def _expectation(request: Request, kv_start: int, reused: bytes) -> RequestExpectation:
    """What a hand-off for `request` must carry: D's prompt ids and sampling values (P's seed is taken only when
    D's request set none, docs/design.md §8), and the KV from the position D's reservation named."""
    return RequestExpectation(tuple(request.prompt_token_ids),
                              HandoffSamplingParams.of_request(request, request.params.seed), kv_start, reused)


def _check_logprobs(request: Request, verdict):
    """A request that asks for logprobs needs t0's from P (the hand-off's `t0_logprobs`, docs/design.md §6)."""
    if request.params.logprobs is None or isinstance(verdict, Reject):
        return verdict
    if (verdict.message.t0_logprobs if isinstance(verdict, Insert) else verdict.t0_logprobs) is None:
        return Reject(request.request_id, ReceiptCheck.INTEGRITY,
                      f"PD: request {request.request_id} asks for logprobs but its hand-off from P carries no "
                      "'t0_logprobs' (P and D must both compute logprobs)")
    return verdict


def _t0_logprob(request: Request, entry: TokenLogprob | None) -> TokenLogprob | None:
    """P's t0 entry, cut to the number of alternatives D's request asks for; None when it asks for none."""
    n = request.params.logprobs
    if n is None or entry is None:
        return None
    return replace(entry, top_token_ids=entry.top_token_ids[:n], top_logprobs=entry.top_logprobs[:n])
