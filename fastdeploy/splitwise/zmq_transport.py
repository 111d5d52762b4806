"""The P↔D connector over ZeroMQ: reservations, hand-offs and acknowledgements between processes (SERVICES §7).

Topology (docs/design.md §8): P binds a ROUTER socket on its `--pd-comm-port`; a D connects one DEALER per P address
(the `prefill_addr` of the request's `disaggregate_info`, cached) and sends reservations and acks on it; P answers
with hand-offs routed to the identity of the DEALER that reserved the request. One object can play both sides (it
binds only when given `listen`), so the same class serves P, D and a test holding both.

Every message is multipart: a header frame (canonical JSON `{"kind", "nonce", "request_id", "tag", "v"}`,
peer_message.py), then the body: a reservation's data (canonical JSON, when D attached any), P's refusal reason
(`{"reason"}`), a whole hand-off's `HandoffMessage.encode_frames()` (a placed one, or one without KV: sent with
`copy=False`, received without a copy, decoded by the same decoder, no pickle anywhere), or a streamed hand-off's
header, pieces and trailer (each its own message, kv_stream.py and zmq_streams.py). `tag` is keyed BLAKE3 (secret.py) over what the hand-off's
own tag does not cover (PD_MTP_FLOW §3, the project's decision): the header fields with the number of body frames,
and every body frame except a hand-off's KV frames. The KV bytes are covered by the hand-off's tag alone (in its
header frame, checked at receipt, PD_MTP_FLOW §5.2 step 1), so no KV byte is hashed twice; the few bytes of that
header frame are under both tags, so a keyed connector authenticates the hand-off even when its tag was sealed
without the key.

Every received message goes through `peer_message.open_message`, which cannot raise; a message it refuses, or one
that is not the receiver's to take (a kind the side does not read, a second reservation of an id whose route
is bound, a replayed nonce, a hand-off for no reservation of D's), is dropped with a WARNING naming the peer and
the reason and counted by reason (`refused_counts`, the `pd_messages_refused_total` metric); where the sender is
known and the id is its own, it is answered (P refuses a D's reservation; D fails its own request at once).
Routes cannot be hijacked: P binds a request's route to the first D that reserves it, until the hand-off is
acknowledged (with that reservation's nonce) or P forgets it (zmq_routes.py); D accepts a hand-off or refusal
only from the P it reserved at, carrying that reservation's nonce, once. D keeps at most `max_peers` DEALERs
(least recently used closed first, never one through which a reservation still awaits its answer; zmq_dealers.py),
and `peer_ready` says whether one completed its handshake. With a PD secret every socket speaks CurveZMQ with keys
derived from it (peer_auth.py): a peer without the secret completes no handshake, so it delivers no frame at all.
D connects to IP literals only (schema/pairing.py `peer_address_error`): libzmq would resolve a host name on its
context's one I/O thread, stalling every socket of D.
Queues are bounded, every wait ends at a deadline, sockets close with linger 0. One I/O thread per object owns the
sockets (zmq_io.py); every public method is thread-safe and none waits for that thread: `reserve`, `send`, `ack`
and `forget` are posts (a refusal is their return value; what became of a reservation comes back through `poll`,
of a hand-off through `finished_sends`), and the thread takes at most `_BATCH` (zmq_receive.py) messages from a socket before it
runs the posted calls again, so no flood of frames can starve them.
"""
from __future__ import annotations

import collections
import logging
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import zmq

from fastdeploy.schema.pairing import peer_address_error
from fastdeploy.splitwise.deadline import Deadline
from fastdeploy.splitwise.integrity import HandoffKey
from fastdeploy.splitwise.kv_stream import Landing
from fastdeploy.splitwise.peer_message import (ACK, REFUSE_REASONS, RESERVE, encode_data, header_frame,
                                               max_frame_bytes, version_error)
from fastdeploy.splitwise.peer_auth import CurveKeys, PeerAuthenticator
from fastdeploy.splitwise.refusals import RefusalLog
from fastdeploy.splitwise.secret import MessageTagger
from fastdeploy.splitwise.transport import (Envelope, HandoffTransport, Payload, PeerUnreachableError, Reservation,
                                            TransportFullError)
from fastdeploy.splitwise.zmq_dealers import Dealers
from fastdeploy.splitwise.zmq_io import CLOSE_TIMEOUT_S, CommandQueue, Mailbox
from fastdeploy.splitwise.zmq_routes import Route, RouteTable
from fastdeploy.splitwise.zmq_receive import ReceivingHalf
from fastdeploy.splitwise.zmq_streams import StreamingHalf, _Job, _Receiving
from fastdeploy.splitwise.zmq_whole import WholeSendingHalf

logger = logging.getLogger(__name__)

__all__ = ["REFUSE_REASONS", "ZmqTransport", "version_error"]

_MAX_RESERVED = 65536     # D remembers that many reservations it sent (the oldest forgotten past it)
_MAX_PEERS = 256          # D keeps that many DEALERs (one per P address) at most
_IDLE_MS = 100            # the I/O thread's longest wait with nothing to send (a call wakes it at once)
_RETRY_MS = 1             # its wait before retrying a piece a full queue refused


@dataclass(slots=True)
class _Reserved:
    """D: the P a request was reserved at and the reservation's nonce; `answered` once P's hand-off or refusal
    for it was delivered (only the ack is left); `abandoned` once D gave up on the request (a late answer is still
    taken and acknowledged, but its DEALER may be closed for another P's)."""

    addr: str
    nonce: str
    accepted: bool = False
    answered: bool = False
    abandoned: bool = False


class ZmqTransport(ReceivingHalf, StreamingHalf, WholeSendingHalf, HandoffTransport):
    needs_peer_address = True   # D reaches each P at the request's disaggregate_info.prefill_addr
    streams_kv = reports_sends = True
    acknowledges_reservations = True

    def __init__(self, listen: str | None = None, secret: bytes | None = None, capacity: int = 64,
                 queue_capacity: int = 4096, max_peers: int = _MAX_PEERS, max_model_len: int = 1 << 16):
        for name, value in (("capacity", capacity), ("queue_capacity", queue_capacity), ("max_peers", max_peers),
                            ("max_model_len", max_model_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ZmqTransport: argument '{name}' must be an int >= 1 (got {value!r})")
        self._capacity, self._queue_capacity = capacity, queue_capacity
        self.max_frame_bytes = max_frame_bytes(max_model_len)   # ZMQ_MAXMSGSIZE of every socket
        self._tagger = MessageTagger(secret)
        self.handoff_key = HandoffKey.from_secret(secret)
        # with a secret only its holders complete a connection (peer_auth.py): strangers deliver no frame
        self._curve = None if secret is None else CurveKeys.from_secret(secret)
        self._context = zmq.Context()
        self._context.setsockopt(zmq.MAX_SOCKETS, max(1024, 4 * max_peers))
        self._router: zmq.Socket | None = None
        self._authenticator: PeerAuthenticator | None = None
        self.address: str | None = None
        if listen is not None:   # bound here, used only by the I/O thread from its start on
            self._router = self._socket(zmq.ROUTER)
            self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)   # a send to a vanished D raises, never vanishes
            if self._curve is not None:
                self._authenticator = PeerAuthenticator(self._context, self._curve)
                self._curve.make_server(self._router)
            self._router.bind(f"tcp://{_host_port(listen, 'listen')}")
            endpoint = self._router.getsockopt(zmq.LAST_ENDPOINT).decode()
            self.address = endpoint.removeprefix("tcp://")
        # the I/O thread's own state (touched by no other thread)
        self._routes = RouteTable()                                                           # P: rid -> route
        self._reserved: collections.OrderedDict[str, _Reserved] = collections.OrderedDict()   # D: rid -> P
        self._jobs: list[_Job] = []                                                         # P: streams going out
        self._receiving: dict[str, _Receiving] = {}                                         # D: streams coming in
        # handed to the engine's thread through the mailbox
        self._mail = Mailbox()
        self._reservations: collections.deque[Reservation] = collections.deque()
        self._acks: collections.deque[str] = collections.deque()
        self._handoffs: collections.deque[Envelope] = collections.deque()
        self._sent: collections.deque[tuple[str, str | None]] = collections.deque()
        self._accepted: collections.deque[str] = collections.deque()                       # D: since last read
        self._refusals = RefusalLog(REFUSE_REASONS, logger)   # what peers sent that was refused, by reason
        # D: where streamed KV lands; the lock is held while a piece is written, so `release_kv` returning means
        # no byte is written into those blocks any more
        self._landing_lock = threading.RLock()
        self._landings: dict[str, Landing] = {}
        self.num_handoffs_received = self.kv_bytes_sent = 0
        self._more_to_read = False   # a socket still held messages after its batch (the next wait is 0)
        self._unsent: dict[bytes, collections.deque[tuple[str, list]]] = {}   # P: whole hand-offs a full queue held
        # D, the engine thread's own state: reservations posted and not yet answered (accepted, refused, failed or
        # forgotten), by P address; at most `capacity` per P (its DEALER's queue), `reserve` refuses past that
        self._engine_lock = threading.RLock()
        self._awaiting: dict[str, str] = {}
        self._awaiting_per_peer: collections.Counter[str] = collections.Counter()
        self._dealers = Dealers(self._socket, self._curve, max_peers, self._engine_lock)   # D: one per P address
        if not self._tagger.is_keyed:
            logger.warning("PD connector: no shared secret (FD_PD_SECRET / --pd-secret-file): anyone who reaches a "
                           "connector socket may deliver frames, and messages are checked for damage only")
        self._commands = CommandQueue()
        self._thread = threading.Thread(target=self._run, name="pd-connector-io", daemon=True)
        self._commands.owner = self._thread
        self._thread.start()

    # ---- D side ----

    def reserve(self, request_id: str, prefill_addr: str | None = None, data: dict | None = None) -> str | None:
        """Post the reservation; returns None when it is queued, or why it is refused now (D awaits answers to
        `capacity` reservations at that P already: retry later). What became of a queued one comes back through
        `poll`: P's answer, or an Envelope with `error` when it could not be sent (no connection can be opened to
        that P, D awaits too many P's). ValueError for bad arguments."""
        if prefill_addr is None:
            raise ValueError(f"ZmqTransport.reserve: request {request_id}: argument 'prefill_addr' is required "
                             "(disaggregate_info.prefill_addr)")
        why = peer_address_error(prefill_addr)
        if why is not None:
            raise ValueError(f"ZmqTransport.reserve: request {request_id}: argument 'prefill_addr' {why}")
        body = () if data is None else (encode_data(request_id, data),)
        with self._engine_lock:
            if self._awaiting_per_peer[prefill_addr] >= self._capacity:
                return (f"D awaits P's answer to {self._capacity} reservations at {prefill_addr} already (its "
                        "queue to that P is full)")
            if not self._commands.post(self._reserve, request_id, prefill_addr, body):
                return "the connector's command queue is full or closed"
            self._settle(request_id)
            self._awaiting[request_id] = prefill_addr
            self._awaiting_per_peer[prefill_addr] += 1
        return None

    def peer_ready(self, prefill_addr: str) -> bool:
        """True once D's DEALER to `prefill_addr` completed its handshake (with a secret: the peer proved it holds
        it); the first call opens the DEALER (posted), and a call after it closed opens it again."""
        if self._dealers.is_ready(prefill_addr):
            return True
        if peer_address_error(prefill_addr) is None and self._dealers.should_connect(prefill_addr) and \
                not self._commands.post(self._connect, prefill_addr):
            self._dealers.forget_asked(prefill_addr)
        return False

    def drop_peer(self, prefill_addr: str) -> None:
        """D gave up on the P at `prefill_addr` (it never completed a connection): close that DEALER unless a
        reservation awaits an answer through it. Posted."""
        self._commands.post(self._drop_unready, prefill_addr)

    def poll(self, deadline: Deadline | None = None) -> Envelope | None:
        envelope = self._mail.take(self._handoffs, deadline)
        if envelope is not None:
            self._settle(envelope.request_id)
        return envelope

    def take_accepted(self) -> list[str]:
        accepted = self._mail.take_all(self._accepted)
        for rid in accepted:
            self._settle(rid)
        return accepted

    def _settle(self, rid: str) -> None:
        """D, engine thread: the reservation of `rid` no longer takes a place in its P's queue."""
        with self._engine_lock:
            addr = self._awaiting.pop(rid, None)
            if addr is not None:
                self._awaiting_per_peer[addr] -= 1
                if not self._awaiting_per_peer[addr]:
                    del self._awaiting_per_peer[addr]

    def ack(self, request_id: str) -> None:
        """Tell P that D is done with the answer delivered for `request_id` (nothing to tell when none was).
        Posted (D's step does not stall behind streams it is taking in); an ack that cannot be sent is logged on
        the I/O thread, and P frees its blocks at its deadline instead."""
        if not self._commands.post(self._ack, request_id):
            logger.error("PD connector: the acknowledgement of request %s could not be queued; P frees its blocks "
                         "at its deadline", request_id)

    # ---- P side ----

    def poll_reservation_with_data(self, deadline: Deadline | None = None) -> Reservation | None:
        return self._mail.take(self._reservations, deadline)

    def send(self, request_id: str, payload: Payload) -> None:
        """Post a hand-off sent whole; `finished_sends` reports it sent or failed (also one that could not be
        queued, e.g. its D's queue holds `MAX_QUEUED_BYTES` already, zmq_whole.py)."""
        frames = [payload] if isinstance(payload, (bytes, bytearray, memoryview)) else list(payload)
        if not self._commands.post(self._send_whole, request_id, frames):
            self._mail.put(self._sent, (request_id, "the connector's command queue is full or closed"))

    def poll_ack(self, deadline: Deadline | None = None) -> str | None:
        return self._mail.take(self._acks, deadline)

    def refuse(self, request_id: str, reason: str) -> None:
        """P: tell the D that reserved `request_id` that P will not write its hand-off (`reason`, one of
        WILL_NOT_WRITE), then forget it; nothing is told when no reservation of it awaits a hand-off. Posted."""
        if not self._commands.post(self._refuse_route, request_id, reason):
            logger.error("PD connector: the refusal of request %s could not be queued (D ends it at its "
                         "deadline)", request_id)

    def forget(self, request_id: str) -> None:
        self._settle(request_id)
        if not self._commands.post(self._forget, request_id):
            logger.error("PD connector: forgetting request %s could not be queued (its route ends at its peer's "
                         "deadline)", request_id)

    # ---- counters and shutdown ----

    def has_mail(self) -> bool:
        with self._mail.cond:
            return bool(self._reservations or self._acks or self._handoffs or self._sent)

    def refused_counts(self) -> dict[str, int]:
        return self._refusals.counts()

    def num_refused(self, reason: str | None = None) -> int:
        """Messages refused (all, or for one of REFUSE_REASONS)."""
        counts = self.refused_counts()
        return sum(counts.values()) if reason is None else counts[reason]

    def close(self) -> None:
        """Stop the I/O thread (it closes the sockets) and release the context; a second call does nothing."""
        if self._commands.closed and not self._thread.is_alive():
            return
        self._commands.mark_closing()
        self._thread.join(timeout=CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            logger.error("PD connector: the I/O thread did not stop within %g s", CLOSE_TIMEOUT_S)
            return
        if self._authenticator is not None:
            self._authenticator.stop()
        self._context.term()

    # ---- the I/O thread ----

    def _run(self) -> None:
        try:
            while not self._commands.closed:
                try:
                    self._commands.run_pending()
                    sent_whole, blocked_whole = self._send_unsent()
                    progressed, blocked = self._send_pieces()
                    self._receive(0 if progressed or sent_whole or self._more_to_read else
                                  _RETRY_MS if blocked or blocked_whole else _IDLE_MS)
                except Exception:   # noqa: BLE001 - the thread must outlive any one bug; logged, loop goes on
                    logger.exception("PD connector: the I/O thread's loop failed; continuing")
        finally:
            self._commands.run_pending()   # what was posted before close (an ack) still leaves
            self._dealers.close_all()
            if self._router is not None:
                self._router.close(linger=0)
            self._router = None
            self._commands.close()

    def _receive(self, timeout_ms: int) -> None:
        """Wait up to `timeout_ms` for a message or a wake-up, then take in what arrived (while the queues it
        fills have room: a full one leaves its socket unread, ZeroMQ's queues then push back on the peer)."""
        poller = zmq.Poller()
        poller.register(self._commands.wake_fd, zmq.POLLIN)
        with self._mail.cond:
            room_p = len(self._reservations) < self._queue_capacity and len(self._acks) < self._queue_capacity
            room_d = len(self._handoffs) < self._queue_capacity
        if self._router is not None and room_p:
            poller.register(self._router, zmq.POLLIN)
        for socket in self._dealers.sockets.values() if room_d else ():
            poller.register(socket, zmq.POLLIN)
        for monitor in self._dealers.monitors():
            poller.register(monitor, zmq.POLLIN)
        ready = dict(poller.poll(timeout_ms))
        self._dealers.take_events(ready)
        more = False
        if self._router is not None and self._router in ready:
            more = self._drain_router()
        for addr, socket in list(self._dealers.sockets.items()):
            if socket in ready:
                more = self._drain_dealer(addr, socket) or more
        self._more_to_read = more

    # ---- internals: sockets ----

    def _socket(self, kind: int) -> zmq.Socket:
        socket = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, self._capacity)
        socket.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes)   # a bigger frame drops that peer, unbuffered
        return socket

    def _dealer(self, addr: str) -> zmq.Socket:
        why = peer_address_error(addr)   # an IP literal: libzmq would resolve a name on its only I/O thread
        if why is not None:
            raise ValueError(f"ZmqTransport: argument 'prefill_addr' {why}")
        return self._dealers.get(addr, self._busy_addresses)

    def _busy_addresses(self) -> set[str]:
        """The P addresses through which a reservation awaits its answer or a stream comes in."""
        return {r.addr for r in self._reserved.values() if not (r.answered or r.abandoned)} | \
            {r.addr for r in self._receiving.values()}

    def _connect(self, addr: str) -> None:
        """Open the DEALER to `addr` (posted by `peer_ready`), closing no other (zmq_dealers.py); one that cannot
        be opened now is asked for again at the next `peer_ready` (its requests fail at the connector's deadline,
        which names the address, so this is not logged: a flood of addresses would flood the log)."""
        try:
            self._dealers.get(addr, None)
        except PeerUnreachableError:
            self._dealers.forget_asked(addr)

    def _drop_unready(self, addr: str) -> None:
        self._dealers.close_if_idle(addr, self._busy_addresses())

    def _require_router(self, what: str) -> zmq.Socket:
        if self._router is None:
            raise RuntimeError(f"ZmqTransport.{what}: this connector does not listen (P side needs 'listen')")
        return self._router

    def _send(self, socket: zmq.Socket, kind: str, request_id: str, nonce: str, frames: Sequence,
              identity: bytes | None = None) -> None:
        """Send one message, its frames without a copy (a `zmq.Frame` as it is: a streamed piece's own copy)."""
        header = header_frame(self._tagger, kind, request_id, nonce, frames)
        parts = ([identity] if identity is not None else []) + [header, *frames]
        try:
            socket.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise TransportFullError(f"ZmqTransport: {kind} for request {request_id}: the peer's queue is full "
                                     f"({self._capacity} messages); nothing was sent") from None
        except zmq.ZMQError as error:
            if error.errno != zmq.EHOSTUNREACH:
                raise PeerUnreachableError(f"ZmqTransport: {kind} for request {request_id}: {error}") from None
            raise PeerUnreachableError(f"ZmqTransport: {kind} for request {request_id}: the peer that reserved it "
                                       "is not connected; nothing was sent") from None

    # ---- internals: calls run on the I/O thread ----

    def _reserve(self, rid: str, prefill_addr: str, body: tuple) -> None:
        """Send a reservation posted by `reserve`; one that cannot be sent fails its request at once (an Envelope
        with the error, through `poll`)."""
        nonce = secrets.token_hex(16)
        self._reserved.pop(rid, None)   # a new reservation of the id: the old one's answers are stale
        self._receiving.pop(rid, None)
        try:
            try:
                self._send(self._dealer(prefill_addr), RESERVE, rid, nonce, body)
            except TransportFullError:   # full of reservations D gave up on: a fresh socket drops them
                if not self._reopen_abandoned(prefill_addr):
                    raise
                self._send(self._dealer(prefill_addr), RESERVE, rid, nonce, body)
        except (TransportFullError, PeerUnreachableError, ValueError) as error:
            self._mail.put(self._handoffs, Envelope(rid, (), error=str(error), unsent=True))
            return
        self._reserved[rid] = _Reserved(prefill_addr, nonce)
        while len(self._reserved) > _MAX_RESERVED:
            self._reserved.popitem(last=False)

    def _reopen_abandoned(self, addr: str) -> bool:
        """Close the DEALER to `addr` when every reservation sent through it was abandoned by D (none awaits an
        answer, none streams in): its full queue holds only reservations nobody waits for, which a P that never
        answers would keep there for good. True when closed (the next `_dealer` opens a fresh one)."""
        mine = [rid for rid, r in self._reserved.items() if r.addr == addr]
        if any(not self._reserved[rid].abandoned for rid in mine) or \
                any(r.addr == addr for r in self._receiving.values()):
            return False
        for rid in mine:
            del self._reserved[rid]
        self._dealers.close(addr)
        logger.warning("PD connector: the queue to P at %s held only reservations D gave up on; reopened", addr)
        return True

    def _ack(self, rid: str) -> None:
        reserved = self._reserved.get(rid)
        if reserved is None or not reserved.answered:   # e.g. a reservation that could not be sent
            logger.debug("PD connector: no answer of P for request %s to acknowledge", rid)
            return
        del self._reserved[rid]
        try:
            self._send(self._dealer(reserved.addr), ACK, rid, reserved.nonce, ())
        except (TransportFullError, PeerUnreachableError, ValueError) as error:
            logger.error("PD connector: the acknowledgement of request %s could not be sent (%s); P frees its "
                         "blocks at its deadline", rid, error)

    def _route_to_send(self, rid: str, what: str) -> Route:
        route = self._routes.get(rid)
        if route is None or route.sent:
            raise ValueError(f"ZmqTransport.{what}: request {rid}: no D has reserved it on this connector")
        return route

    def _refuse_route(self, rid: str, reason: str) -> None:
        route = self._routes.get(rid)
        if route is not None and not route.sent:
            self._answer_refusal(route.identity, rid, route.nonce, reason)
        self._forget(rid)

    def _forget(self, rid: str) -> None:
        self._routes.drop(rid)
        reserved = self._reserved.get(rid)
        if reserved is not None:
            reserved.abandoned = True
        for job in [job for job in self._jobs if job.request_id == rid]:
            self._end_job(job, "the hand-off was given up before it was sent whole")


def _host_port(value: str, name: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"ZmqTransport: argument '{name}' must be 'host:port' (got {value!r})")
    return value
