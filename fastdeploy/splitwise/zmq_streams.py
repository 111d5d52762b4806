"""The streamed hand-off's half of ZmqTransport (kv_stream.py, SERVICES §7), run on its I/O thread: P sends every
stream one message at a time, in turn, so a D whose queue is full delays no other D's; D writes each piece into the
request's landing under the landing lock (so `release_kv` returning means nothing more is written there), verifies
the tag at the trailer and delivers the placed hand-off. A piece that is not D's to take is refused by itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import zmq

from fastdeploy.splitwise.kv_stream import SEQ, Incoming, Landing, OutgoingStream, StreamError
from fastdeploy.splitwise.peer_message import END, KV, STREAM, Opened
from fastdeploy.splitwise.transport import Envelope, PeerUnreachableError, TransportFullError
from fastdeploy.splitwise.zmq_routes import Route


@dataclass(slots=True)
class _Job:
    """P: a streamed hand-off on its way (kv_stream.py): the next message to send is built when the previous one
    left; `pending` is one a full queue refused, sent again first. Each piece is copied out of P's blocks into
    libzmq's own message as it is handed over (`_piece_frames`), so once the job sends nothing more it reads
    P's blocks no more, whatever libzmq still holds: a partitioned D's queue never pins P's blocks."""

    request_id: str
    route: Route
    stream: OutgoingStream
    stage: int = 0                       # 0: header next, 1: pieces, 2: trailer sent
    pending: tuple | None = None
    error: str | None = None             # why it ended early (None: sent whole)


def _piece_frames(piece: list) -> list[zmq.Frame]:
    """A piece's frames as libzmq messages of their own: a view of P's blocks is copied (one memcpy, ~1 MiB a
    piece: about 10 ms of a 128 MiB hand-off that takes 85-160 ms on loopback, docs/benchmarks.md), so P may free
    the blocks at once, at its deadline too, whatever libzmq holds (a queue to a partitioned D keeps its copies
    until that connection drops); bytes the stream owns already go as they are."""
    return [zmq.Frame(f, copy=isinstance(f, memoryview)) for f in piece]


@dataclass(slots=True)
class _Receiving:
    """D: a streamed hand-off arriving from the P at `addr` for the reservation with `nonce`."""

    addr: str
    nonce: str
    incoming: Incoming
    landing: Landing             # what D registered (the stream writes into it unless it describes other bytes)


class StreamingHalf:
    """Mixed into ZmqTransport: it provides `_send`, `_refusals`, `_deliver`, `_route_to_send`, `_require_router`,
    `_commands`, `_mail` and the state these methods use (`_jobs`, `_sent`, `_receiving`,
    `_landings`, `_landing_lock`)."""

    # ---- D side ----

    def expect_kv(self, request_id: str, landing: Landing) -> None:
        with self._landing_lock:
            self._landings[request_id] = landing

    def release_kv(self, request_id: str) -> None:
        with self._landing_lock:   # waits for a piece being written (one piece at most)
            self._landings.pop(request_id, None)
        self._commands.post(self._stop_receiving, request_id)

    def _stop_receiving(self, rid: str) -> None:
        """On the I/O thread: the request ended, its stream (if one was arriving) is dropped."""
        receiving = self._receiving.get(rid)
        with self._landing_lock:
            if receiving is not None and self._landings.get(rid) is not receiving.landing:
                del self._receiving[rid]

    # ---- P side ----

    def send_stream(self, request_id: str, stream: OutgoingStream) -> None:
        """Queue the stream for the I/O thread and return at once (waiting for that thread cost P's step ~1 ms a
        hand-off); whatever becomes of it, `finished_sends` reports it."""
        self._commands.post(self._start_stream, request_id, stream)

    def finished_sends(self) -> list[tuple[str, str | None]]:
        return self._mail.take_all(self._sent)

    # ---- internals, on the I/O thread: P ----

    def _start_stream(self, rid: str, stream: OutgoingStream) -> None:
        try:
            route = self._route_to_send(rid, "send_stream")
            self._require_router("send_stream")
        except (ValueError, RuntimeError) as error:   # nothing was sent: the stream reads P's blocks no more
            self._mail.put(self._sent, (rid, str(error)))
            return
        route.sent = True
        self._jobs.append(_Job(rid, route, stream))

    def _send_pieces(self) -> tuple[bool, bool]:
        """One message of every stream in turn (so a slow D delays no other D's); (any sent, any blocked by a
        full queue)."""
        progressed = blocked = False
        for job in list(self._jobs):
            message = job.pending or self._next_message(job)
            if message is None:
                self._end_job(job, None)
                continue
            kind, frames = message
            try:
                self._send(self._router, kind, job.request_id, job.route.nonce, frames, job.route.identity)
            except TransportFullError:
                job.pending, blocked = message, True
                continue
            except PeerUnreachableError as error:
                self._end_job(job, str(error))
                continue
            job.pending, progressed = None, True
            if kind == KV:
                self.kv_bytes_sent += sum(len(frame) for frame in frames[1:])
        return progressed, blocked

    def _next_message(self, job: _Job) -> tuple[str, list] | None:
        if job.stage == 0:
            job.stage = 1
            return STREAM, [job.stream.header]
        if job.stage == 1:
            piece = job.stream.next_piece()
            if piece is not None:
                return KV, [SEQ.pack(job.stream.num_pieces - 1), *_piece_frames(piece)]
            job.stage = 2
            return END, [job.stream.trailer()]
        return None

    def _end_job(self, job: _Job, error: str | None) -> None:
        """The stream sends nothing more and reads P's blocks no more: reported done (or failed, with why)."""
        self._jobs.remove(job)
        job.error = error
        self._mail.put(self._sent, (job.request_id, error))

    # ---- internals, on the I/O thread: D ----

    def _start_receiving(self, addr: str, sender: str, reserved, message: Opened) -> None:
        rid = message.request_id
        reserved.answered = True   # its answer has begun: nothing else of P's for this reservation is taken
        with self._landing_lock:
            landing = self._landings.get(rid)
        if landing is None:
            self._refusals.refuse("stale", rid,
                                  f"a streamed hand-off from {sender} for a request with no blocks to land in")
            self._deliver(rid, Envelope(rid, (), error=f"{sender} streamed the KV, but D holds no blocks for it"))
            return
        try:
            self._receiving[rid] = _Receiving(addr, message.nonce,
                                              Incoming.start(message.body[0], landing, self.handoff_key), landing)
        except StreamError as error:
            self._fail_stream(rid, sender, error)

    def _stream_message(self, addr: str, sender: str, message: Opened) -> None:
        """A piece or the trailer of a streamed hand-off: written into the request's blocks under the landing
        lock (so `release_kv` never returns while a piece is being written), verified at the trailer."""
        rid = message.request_id
        receiving = self._receiving.get(rid)
        if receiving is None or receiving.addr != addr or receiving.nonce != message.nonce:
            self._refusals.refuse("stale", rid,
                                  f"a {message.kind} from {sender} for no streamed hand-off of D's arriving")
            return
        incoming = receiving.incoming
        with self._landing_lock:
            if self._landings.get(rid) is not receiving.landing:   # the request ended: its blocks are not ours
                del self._receiving[rid]
                self._refusals.refuse("stale", rid,
                                      f"a {message.kind} from {sender} for a request D no longer awaits")
                return
            try:
                if message.kind == KV:
                    incoming.write(message.body[0], message.body[1:])
                    return
                frame = incoming.finish(message.body[0] if message.body else memoryview(b""))
            except StreamError as error:
                self._fail_stream(rid, sender, error)
                return
        del self._receiving[rid]
        self._deliver(rid, Envelope(rid, (frame,), kv_landed=incoming.written))
        self.num_handoffs_received += 1

    def _fail_stream(self, rid: str, sender: str, error: StreamError) -> None:
        """A stream D cannot take fails its request at once: refused (counted) unless only its tag is wrong,
        which the receipt counts (PD_MTP_FLOW §5.2 step 1)."""
        self._receiving.pop(rid, None)
        if error.reason is not None:
            self._refusals.refuse(error.reason, rid, f"a streamed hand-off from {sender}: {error}")
        self._deliver(rid, Envelope(rid, (), error=f"{sender}'s streamed hand-off: {error}"))
