"""The prefill role's connector: P computes a prompt only once D has reserved its blocks, then hands it off.

PD_MTP_FLOW §4 and SERVICES §6 steps 3-4. A request and D's reservation for its id may come in either order: the
request waits for the peer (WAITING_FOR_PEER, holding nothing) until the reservation is polled, and a reservation
alone waits for its request; either expires after the RESERVATION deadline (an expired request fails with an
error for its client). The request's first token ends its part on P (`remote_decode`): when the scheduler
finishes it ("handed_off"), this connector sends the hand-off: over a streaming transport (ZeroMQ) the transport's
thread reads the KV out of the request's blocks piece by piece while earlier pieces move (splitwise/kv_stream.py),
the blocks stay held until it is done ("delay free"); otherwise the worker half reads it into the hand-off (a copy,
so the blocks go back with the slot). D's acknowledgement, or the KV_TRANSFER deadline (scaled by the hand-off's
KV bytes, splitwise/deadline.py), ends the request's part on P.

With a one-sided transfer engine (Mooncake), D's reservation says where the request's blocks lie on D: P copies
the prompt's KV into a staging slot (its blocks go back once the copy is done), writes it from there into D's
blocks, hashing the bytes while they move, and sends the header alone once the write landed; with every staging
slot taken it writes from its blocks, which stay held until the engine lets go of the write. P writes only within
PREFILL_RESULT of receiving the reservation (D gives up at that deadline and later reuses the blocks; docs/design.md
§8).
"""
from __future__ import annotations

import functools
import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from threading import Event

from fastdeploy.engine.connector.base import PDConnector
from fastdeploy.schema.request import (FINISH_ABORT, FINISH_HANDED_OFF, PDTimings, Request, RequestIdInUseError,
                                       RequestStatus)
from fastdeploy.splitwise import HandoffMessage, HandoffSamplingParams, Payload, TransportFullError, WaitKind
from fastdeploy.splitwise.kv_stream import OutgoingStream
from fastdeploy.splitwise.mooncake import Destination, WritesStillRunning
from fastdeploy.splitwise.transport import Reservation

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Placement:
    """A one-sided write running on the placing thread."""
    future: Future
    copied: Event               # set once its KV was copied out of the request's blocks (staged)
    blocks_back: bool = False   # the blocks were reported free


@dataclass(slots=True)
class _Unsent:
    request_id: str
    payload: Payload
    kv_bytes: int       # KV the hand-off carries or placed in D's blocks


class PrefillConnector(PDConnector):
    role, peer_role = "prefill", "decode"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._reserved: set[str] = set()              # D's reservation present, request not yet
        self._outbox: deque[_Unsent] = deque()        # hand-offs a full transport refused so far
        self._reservation_data: dict[str, tuple[Reservation, float]] = {}   # what D attached, when it came
        self._num_sent = self._kv_bytes_sent = self._num_send_failed = 0
        self._streaming: dict[str, int] = {}          # hand-offs the transport is streaming -> their KV bytes
        self._sending: dict[str, int] = {}            # whole hand-offs posted, not yet reported -> their KV bytes
        self._transfers_done: list[str] = []          # streams / writes done, blocks not yet reported
        self._placing: dict[str, _Placement] = {}     # one-sided writes running off the engine's thread
        self._still_reading: dict[str, Event] = {}    # timed-out writes the transfer engine still runs -> ended
        self._placer: ThreadPoolExecutor | None = None

    # ---- scheduler half ----

    def admit(self, request: Request, disaggregate_info: dict | None) -> RequestStatus:
        self.parse_info(request, disaggregate_info)
        rid = request.request_id
        if self.has_state(rid) and rid not in self._reserved:
            raise RequestIdInUseError(f"'request_id' {rid!r} is already in use (its hand-off is not over)")
        request.remote_decode = True
        request.pd_timings = PDTimings(arrival_s=time.perf_counter())
        if rid in self._reserved:
            self._reserved.discard(rid)
            self.waits.finish(rid)
            request.pd_timings.prefill_start_s = request.pd_timings.arrival_s
            return RequestStatus.WAITING
        self.waits.start(rid, WaitKind.RESERVATION)
        return RequestStatus.WAITING_FOR_PEER

    def poll(self, wait_s: float) -> None:
        """Send what a full transport refused, match reservations, reclaim acknowledged blocks, expire waits.
        The idle wait goes to the message P awaits: a reservation while a request waits for one, else an ack."""
        self._flush_outbox()
        waiting_for_reservation = bool(self.scheduler.peer_waiting)
        self._match_reservations(wait_s if waiting_for_reservation else 0.0)
        self._read_acks(wait_s if self.waits and not waiting_for_reservation else 0.0)
        self._expire_waits()
        self._finish_streams()
        self._finish_placements()

    def request_finished(self, request: Request) -> bool:
        """PD_MTP_FLOW §4.4: a request ending "handed_off" carries [t0] / [t0, d1]; send the hand-off. The KV is
        skipped when t0 terminates the request (D finishes it at receipt). Over a streaming transport the KV is
        read out of the blocks by the transport's thread while it goes out, so they stay held ("delay free",
        True) until the stream is done; a one-sided write on the placing thread keeps them held until it has
        copied them into staging (or, written in place, until it is over); otherwise they go back with the slot:
        an inline hand-off carries a copy of the KV, and an inline one-sided write has copied them or landed
        (one in place that timed out while the transfer engine still runs it keeps them held until the engine
        lets go). The KV_TRANSFER wait lasts until D acknowledges, which D does for every hand-off."""
        rid = request.request_id
        self.waits.finish(rid)                   # a request failed while waiting for its reservation
        if request.finish_reason != FINISH_HANDED_OFF:   # before any write: D is told, it stops waiting now
            self._reservation_data.pop(rid, None)
            self.safe_refuse(rid, "abandoned")
            return False
        request.pd_timings.first_token_s = time.perf_counter()
        try:
            return self._hand_off(request)
        except Exception as error:   # noqa: BLE001 - one failed hand-off fails its request, never the instance
            logger.exception("PD prefill: hand-off of request %s failed", rid)
            self._num_send_failed += 1
            still_running = isinstance(error, WritesStillRunning)
            if still_running and not error.staged:   # the engine may still read P's blocks: P keeps them
                self._still_reading[rid] = error.ended
            if not still_running:   # else D keeps its quarantine while the engine may still write into it
                self.safe_refuse(rid, "abandoned")   # it failed before anything was written or sent
            self.waits.finish(rid)
            self._outbox = deque(item for item in self._outbox if item.request_id != rid)
            self._sending.pop(rid, None)
            request.finish_reason = FINISH_ABORT
            request.error = f"PD: request {rid}: the hand-off could not be sent: {error}"
            return rid in self._still_reading
        return False

    def _hand_off(self, request: Request) -> bool:
        """Send the hand-off; True when the KV is still read from the request's blocks off this thread (a stream,
        or a one-sided write, over an asynchronous transport): they stay held until `finished_transfers` names
        the request."""
        rid = request.request_id
        t0 = request.first_round_drafts[0]
        terminates = t0 in request.eos_token_ids or request.params.max_tokens <= 1
        reservation, reserved_at = self._reservation_data.pop(rid, (None, 0.0))
        data = None if reservation is None else reservation.data
        kv_start = self._kv_start(data, len(request.prompt_token_ids))
        skip = kv_start // self.resources.block_size
        block_ids = list(request.block_ids[skip:])   # the blocks of positions kv_start..L-1
        length = len(request.prompt_token_ids) - kv_start
        reused = self.resources.prefix_keys(request.prompt_token_ids, skip, request.params.cache_salt)
        fields = dict(
            request_id=rid, prompt_token_ids=request.prompt_token_ids,
            sampling=HandoffSamplingParams.of_request(request, request.seed),
            t0=t0, draft_token_ids=request.first_round_drafts, config_hash=self.config_hash,
            key=self.transport.handoff_key,
            t0_logprobs=request.output_logprobs[0] if request.output_logprobs else None, kv_start=kv_start)
        nbytes = 0 if terminates else self.handoff_kv_bytes(length)   # what the deadlines scale by
        if self.kv_transfer is not None and not terminates:
            limit_s = self.deadlines.timeout_s(WaitKind.PREFILL_RESULT, nbytes)   # D's, scaled alike
            left_s = limit_s - (self.clock.now() - reserved_at)
            if left_s <= 0:
                raise RuntimeError(f"D's reservation is older than its {limit_s:.4g} s deadline; its blocks may "
                                   "be reused, so P does not write into them")
            # the write must land before D gives up on the blocks, so it may take no longer than what is left
            copied = Event()
            placing = functools.partial(self._place, fields, reused, Destination.parse(data), block_ids, length,
                                        left_s, copied)
            if self.transport.streams_kv:   # an asynchronous transport: the write goes off this thread too
                return self._place_later(rid, placing, copied, nbytes)
            frames, nbytes = placing()
        elif self.transport.streams_kv and not terminates:
            return self._stream(rid, fields, reused, block_ids, length)
        else:
            kv_target, kv_mtp = ([], []) if terminates else self.kv.read_prompt_kv(block_ids, length)
            message = HandoffMessage.create(**fields, kv_target=kv_target, kv_mtp=kv_mtp, reused=reused)
            frames, nbytes = message.encode_frames(), message.kv_nbytes
        self.waits.start(rid, WaitKind.KV_TRANSFER, nbytes)     # ends at D's ack
        self._send_whole(_Unsent(rid, frames, nbytes))
        return False

    def _kv_start(self, data: dict | None, prompt_len: int) -> int:
        """Where the hand-off's KV starts: D's reservation names the prompt positions its prefix cache already
        holds (whole blocks, at least the last position left to send; PD_MTP_FLOW §13.6). ValueError for any
        other value (the hand-off then fails: P cannot tell what D holds)."""
        kv_start = 0 if data is None else data.get("kv_start", 0)
        block_size = self.resources.block_size
        if isinstance(kv_start, bool) or not isinstance(kv_start, int) or not 0 <= kv_start < prompt_len \
                or kv_start % block_size:
            raise ValueError(f"D's reservation has 'kv_start' {kv_start!r:.40}: it must be a multiple of the block "
                             f"size {block_size} below the prompt's {prompt_len} tokens")
        return kv_start

    def _place(self, fields: dict, reused: bytes, destination: Destination, block_ids: list[int], length: int,
               timeout_s: float, copied: Event) -> tuple[list, int]:
        """The one-sided write (Mooncake): copy into staging (`copied` set then), submit the writes, hash the bytes
        while they move, wait for them (within `timeout_s`); the placed header's frames and the KV bytes placed."""
        chunks = self.kv_transfer.write_to(destination, block_ids, length, timeout_s=timeout_s,
                                           on_copied=copied.set)
        message = HandoffMessage.create_placed(**fields, placed_kv=self.kv.placed_kv(length), kv_chunks=chunks,
                                               reused=reused)
        return message.encode_frames(), message.kv_nbytes

    def _place_later(self, rid: str, placing, copied: Event, nbytes: int) -> bool:
        """Run the one-sided write on the placing thread; its header is queued by `poll` once the write landed.
        The blocks stay held until `poll` sees the copy into staging done, or the write over (written in place)."""
        if self._placer is None:
            self._placer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pd-placing")
        self._placing[rid] = _Placement(self._placer.submit(placing), copied)
        self.waits.start(rid, WaitKind.KV_TRANSFER, nbytes)     # ends at D's ack
        return True

    def _finish_placements(self) -> None:
        """Writes whose KV was copied into staging: their blocks go back. Writes that are over: the blocks of one
        written in place go back; the header of one that landed is sent (unless its wait expired meanwhile), one
        that failed ends its wait now. A write in place that timed out while the transfer engine still runs it may
        still be reading its blocks: its hand-off fails now, its blocks go back only once the engine lets go of it
        (else a later request's KV could land in D's blocks in their place)."""
        for rid, placement in self._placing.items():
            if placement.copied.is_set():
                self._release_blocks(rid, placement)
        for rid in [rid for rid, placement in self._placing.items() if placement.future.done()]:
            placement = self._placing.pop(rid)
            try:
                frames, nbytes = placement.future.result()
            except WritesStillRunning as error:
                if error.staged:
                    self._release_blocks(rid, placement)
                else:
                    self._still_reading[rid] = error.ended
                held = "its staging slot stays" if error.staged else "its blocks stay"
                self._give_up_sending(rid, f"the one-sided write failed: {error}; {held} held until the transfer "
                                           "engine gives it up")
                continue
            except Exception as error:   # noqa: BLE001 - one failed write fails its hand-off, never the instance
                self._release_blocks(rid, placement)
                self._give_up_sending(rid, f"the one-sided write failed: {error}")
                continue
            self._release_blocks(rid, placement)
            if rid in self.waits:
                self._send_whole(_Unsent(rid, frames, nbytes))
        for rid in [rid for rid, ended in self._still_reading.items() if ended.is_set()]:
            del self._still_reading[rid]
            self._transfers_done.append(rid)
            logger.info("PD prefill: the transfer engine let go of request %s's timed-out write; its blocks go "
                        "back", rid)

    def _release_blocks(self, rid: str, placement: _Placement) -> None:
        """The write no longer reads the request's blocks: they go back (once)."""
        if not placement.blocks_back:
            placement.blocks_back = True
            self._transfers_done.append(rid)

    def close(self) -> None:
        if self._placer is not None:   # each write is bounded by its timeout
            self._placer.shutdown(wait=True, cancel_futures=True)
        super().close()

    def _stream(self, rid: str, fields: dict, reused: bytes, block_ids: list[int], length: int) -> bool:
        """Hand the transport's thread the hand-off's stream (kv_stream.py): it reads the KV out of the request's
        blocks piece by piece (on a device cache, out of one copy gathered here) while earlier pieces move."""
        message = HandoffMessage.create_streamed(**fields, placed_kv=self.kv.placed_kv(length))
        if self.kv.in_host_memory:
            chunks = self.kv.prompt_kv_chunks(block_ids, length)
        else:
            chunks = [a for group in self.kv.read_prompt_kv(block_ids, length) for a in group]
        stream = OutgoingStream.of(message, chunks, self.transport.handoff_key, reused)
        self.transport.send_stream(rid, stream)
        self.waits.start(rid, WaitKind.KV_TRANSFER, stream.kv_nbytes)     # ends at D's ack
        self._streaming[rid] = stream.kv_nbytes
        return True

    def finished_transfers(self) -> list[str]:
        done, self._transfers_done = self._transfers_done, []
        return done

    def has_unfinished(self) -> bool:
        """Reservations without their request, hand-offs unsent or awaiting D's ack, every wait on D (its acks
        are read only while the engine keeps stepping), and mail not yet polled (an idle P steps to take in the
        reservations that arrived, so their queue never stays full)."""
        return bool(self._reserved or self._outbox or self.waits or self._streaming or self._transfers_done or
                    self._placing or self._still_reading or self._sending or self.transport.has_mail())

    def has_state(self, rid: str) -> bool:
        """The id has connector state left: a reservation, a hand-off unsent, being written or awaiting D's ack,
        a wait."""
        return rid in self._reserved or rid in self.waits or rid in self._streaming or rid in self._placing or \
            rid in self._still_reading or rid in self._sending or any(item.request_id == rid for item in self._outbox)

    def describe_held(self) -> str:
        unacked = self.waits.ids_of(WaitKind.KV_TRANSFER)
        held = [f"reservations without a request {sorted(self._reserved)}" if self._reserved else "",
                f"hand-offs awaiting D's ack {sorted(unacked)}" if unacked else "",
                f"{len(self._outbox)} unsent hand-offs" if self._outbox else "",
                f"hand-offs streaming from their blocks {sorted(self._streaming)}" if self._streaming else "",
                f"one-sided writes in flight {sorted(self._placing)}" if self._placing else "",
                f"timed-out writes the transfer engine still runs {sorted(self._still_reading)}"
                if self._still_reading else ""]
        return ", ".join(h for h in held if h)

    def counters(self) -> dict:
        """SERVICES §4 PD metrics of P (cumulative): hand-offs sent, KV bytes sent, hand-offs that could not be
        sent (transport full until KV_TRANSFER, or the send / the one-sided write failed), refusals; with a
        transfer engine, the writes in flight from its staging pool (a gauge)."""
        counts = {"handoffs_sent": self._num_sent, "kv_bytes_sent": self._kv_bytes_sent,
                  "send_failed": self._num_send_failed, "refused": self.transport.refused_counts(),
                  "transport_errors": self.num_transport_errors}
        if self.kv_transfer is not None:   # a gauge: staging slots the transfer engine has not let go of
            counts["staged_writes"] = self.kv_transfer.staged_writes()
        return counts

    # ---- internals ----

    def _match_reservations(self, wait_s: float) -> None:
        deadline = self.deadline(wait_s)
        while (reservation := self.transport.poll_reservation_with_data(deadline)) is not None:
            deadline = None
            rid = reservation.request_id
            request = self.scheduler.peer_waiting.get(rid)
            if request is None and (self.has_state(rid) or self.scheduler.find(rid) is not None):
                # the transport binds a route to its first reserver; one without routes (in-process) lands here
                logger.warning("PD prefill: duplicate reservation for request %s refused (the first one stands)",
                               rid)
                self.safe_refuse(rid, "duplicate")   # its route is the duplicate's: the first one's has ended
                continue
            self._reservation_data[rid] = (reservation, self.clock.now())   # decoded at its hand-off
            if request is not None:
                self.waits.finish(rid)
                request.pd_timings.prefill_start_s = time.perf_counter()
                self.scheduler.release_to_waiting(request)
            else:
                self._reserved.add(rid)
                self.waits.start(rid, WaitKind.RESERVATION)

    def _read_acks(self, wait_s: float) -> None:
        deadline = self.deadline(wait_s)
        while (rid := self.transport.poll_ack(deadline)) is not None:
            deadline = None
            self.waits.finish(rid)

    def _expire_waits(self) -> None:
        for wait in self.waits.pop_expired():
            rid = wait.request_id
            if wait.kind is WaitKind.KV_TRANSFER:
                self.safe_forget(rid)
                self._sending.pop(rid, None)
                unsent = next((item for item in self._outbox if item.request_id == rid), None)
                if unsent is not None:
                    self._outbox.remove(unsent)
                    self._num_send_failed += 1
                    logger.error("PD prefill: hand-off of request %s not sent within %g s (the transport stayed "
                                 "full); D fails it at its own deadline", rid, wait.timeout_s)
            elif rid in self.scheduler.peer_waiting:
                self.scheduler.finish(self.scheduler.peer_waiting[rid], FINISH_ABORT, wait.error)
            else:
                self._reserved.discard(rid)
                self._reservation_data.pop(rid, None)
                self.safe_refuse(rid, "expired")
                logger.warning("PD prefill: reservation for request %s dropped: no request came within %g s",
                               rid, wait.timeout_s)

    def _send_whole(self, item: _Unsent) -> None:
        """A hand-off sent whole: posted to a transport that reports its sends (it holds the hand-off while its D's
        queue is full, in order per D; `finished_sends` says how it went), else sent through the outbox."""
        if not self.transport.reports_sends:
            self._outbox.append(item)
            self._flush_outbox()
            return
        try:
            self.transport.send(item.request_id, item.payload)
        except Exception as error:   # noqa: BLE001 - nothing the transport raises leaves the engine step
            self.count_transport_error("send", item.request_id, error)
            self._give_up_sending(item.request_id, str(error))
            return
        self._sending[item.request_id] = item.kv_bytes

    def _flush_outbox(self) -> None:
        """Send in order (an in-process transport has one peer): a full queue keeps the hand-offs for the next
        poll (bounded by KV_TRANSFER); one the transport cannot send at all fails now."""
        while self._outbox:
            item = self._outbox[0]
            try:
                self.transport.send(item.request_id, item.payload)
            except TransportFullError:
                return
            except Exception as error:   # noqa: BLE001 - one unsendable hand-off fails its request, never P
                self._outbox.popleft()
                self.count_transport_error("send", item.request_id, error)
                self._give_up_sending(item.request_id, str(error))
                continue
            self._outbox.popleft()
            self._num_sent += 1
            self._kv_bytes_sent += item.kv_bytes

    def _finish_streams(self) -> None:
        """Hand-offs the transport is done with (streams, and whole ones it reported): a stream's blocks may go
        back; a failed one ends its wait now."""
        for rid, error in self.transport.finished_sends():
            nbytes = self._sending.pop(rid, None)
            if nbytes is None:
                nbytes = self._streaming.pop(rid, None)
                if nbytes is None:
                    continue
                self._transfers_done.append(rid)
            if error is None:
                self._num_sent += 1
                self._kv_bytes_sent += nbytes
            else:
                self._give_up_sending(rid, error)

    def _give_up_sending(self, rid: str, why: str) -> None:
        """A hand-off that can never be sent: its wait ends now, not at its KV_TRANSFER deadline."""
        self._num_send_failed += 1
        self.waits.finish(rid)
        self._sending.pop(rid, None)
        self.safe_forget(rid)
        logger.error("PD prefill: hand-off of request %s not sent (%s); D fails it at its own deadline", rid, why)
