"""The P↔D connector over ZeroMQ: reservations, hand-offs and acknowledgements between processes (SERVICES §7).

Topology (docs/design.md §8): P binds a ROUTER socket on its `--pd-comm-port`; a D connects one DEALER per P address
(the `prefill_addr` of the request's `disaggregate_info`, cached) and sends reservations and acks on it; P answers
with hand-offs routed to the identity of the DEALER that reserved the request. One object can play both sides (it
binds only when given `listen`), so the same class serves P, D and a test holding both.

Every message is multipart: a header frame (canonical JSON `{"v", "kind", "request_id", "tag"}`), then the body:
a reservation's data (canonical JSON, when D attached any), or a hand-off's `HandoffMessage.encode_frames()` (wire
format v2: each KV array is its own frame, sent with `copy=False` and received without a copy; the receiver decodes
the frames with the same decoder, no pickle anywhere). `tag` is keyed BLAKE3 (secret.py) over what the hand-off's
own tag does not cover (PD_MTP_FLOW §3, the project's decision): the header fields with the number of body frames,
and every body frame except a hand-off's KV frames. The KV bytes are covered by the hand-off's tag alone (in its
header frame, checked at receipt, PD_MTP_FLOW §5.2 step 1), so no KV byte is hashed twice; the few bytes of that
header frame are under both tags, so a keyed connector authenticates the hand-off even when its tag was sealed
without the key. A message whose tag does not verify, that speaks another protocol version, or that is malformed,
is refused, logged and counted (`num_refused`), never delivered.
Queues are bounded, every wait ends at a deadline, sockets close with linger 0. Not thread-safe: one thread (the
engine loop) uses an object.
"""
from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Sequence

import zmq

from fastdeploy.splitwise.deadline import Deadline
from fastdeploy.splitwise.integrity import PROTOCOL_VERSION, HandoffKey, canonical_json
from fastdeploy.splitwise.secret import MessageTagger
from fastdeploy.splitwise.transport import Envelope, HandoffTransport, Payload, Reservation, TransportFullError

logger = logging.getLogger(__name__)

RESERVE, ACK, HANDOFF, REFUSE = "reserve", "ack", "handoff", "refuse"
_KINDS = {RESERVE, ACK, HANDOFF, REFUSE}
_BAD_TAG = ("the connector's message tag did not verify (a wrong or missing shared secret on one side, or frames "
            "damaged on the way)")
_MAX_REQUEST_ID = 512
_MAX_IDENTITIES = 65536   # P remembers which D reserved a request until it sends the hand-off; oldest forgotten
_MAX_RESERVATION_DATA = 1 << 20   # bytes of JSON a reservation may carry (block destinations of a long prompt)
REFUSE_REASONS = ("bad_tag", "malformed", "unexpected_kind", "version")


def version_error(peer: str, version: object) -> str:
    """The refusal of a peer on another protocol version, naming both versions."""
    return (f"{peer} speaks PD connector protocol version {version!r}; this build speaks version {PROTOCOL_VERSION} "
            "(upgrade P and D together)")


class ZmqTransport(HandoffTransport):
    needs_peer_address = True   # D reaches each P at the request's disaggregate_info.prefill_addr

    def __init__(self, listen: str | None = None, secret: bytes | None = None, capacity: int = 64,
                 queue_capacity: int = 4096):
        for name, value in (("capacity", capacity), ("queue_capacity", queue_capacity)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ZmqTransport: argument '{name}' must be an int >= 1 (got {value!r})")
        self._capacity, self._queue_capacity = capacity, queue_capacity
        self._tagger = MessageTagger(secret)
        self.handoff_key = HandoffKey.from_secret(secret)
        self._context = zmq.Context()
        self._router: zmq.Socket | None = None
        self.address: str | None = None
        if listen is not None:
            self._router = self._socket(zmq.ROUTER)
            self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)   # a send to a vanished D raises, never vanishes
            self._router.bind(f"tcp://{_host_port(listen, 'listen')}")
            endpoint = self._router.getsockopt(zmq.LAST_ENDPOINT).decode()
            self.address = endpoint.removeprefix("tcp://")
        self._dealers: dict[str, zmq.Socket] = {}
        self._identity: collections.OrderedDict[str, bytes] = collections.OrderedDict()   # P: rid -> D identity
        self._peer_of: dict[str, str] = {}                       # D: rid -> the P address it is exchanged with
        self._reservations: collections.deque[Reservation] = collections.deque()
        self._acks: collections.deque[str] = collections.deque()
        self._handoffs: collections.deque[Envelope] = collections.deque()
        self._refused = dict.fromkeys(REFUSE_REASONS, 0)
        self.num_handoffs_sent = self.num_handoffs_received = self.kv_bytes_sent = 0
        if not self._tagger.is_keyed:
            logger.warning("PD connector: no shared secret (FD_PD_SECRET / --pd-secret-file): messages are checked "
                           "for damage only, not authenticated")

    # ---- D side ----

    def reserve(self, request_id: str, prefill_addr: str | None = None, data: dict | None = None) -> None:
        if prefill_addr is None:
            raise ValueError(f"ZmqTransport.reserve: request {request_id}: argument 'prefill_addr' is required "
                             "(disaggregate_info.prefill_addr)")
        body = () if data is None else (_encode_data(request_id, data),)
        self._send(self._dealer(prefill_addr), RESERVE, request_id, body)
        self._peer_of[request_id] = prefill_addr

    def poll(self, deadline: Deadline | None = None) -> Envelope | None:
        return self._wait(self._handoffs, self._drain_dealers, deadline)

    def ack(self, request_id: str) -> None:
        addr = self._peer_of.pop(request_id, None)
        if addr is None:
            raise ValueError(f"ZmqTransport.ack: request {request_id} has no hand-off to acknowledge")
        self._send(self._dealer(addr), ACK, request_id, ())

    # ---- P side ----

    def poll_reservation(self, deadline: Deadline | None = None) -> str | None:
        reservation = self.poll_reservation_with_data(deadline)
        return None if reservation is None else reservation.request_id

    def poll_reservation_with_data(self, deadline: Deadline | None = None) -> Reservation | None:
        return self._wait(self._reservations, self._drain_router, deadline)

    def send(self, request_id: str, payload: Payload) -> None:
        identity = self._identity.get(request_id)
        if identity is None:
            raise ValueError(f"ZmqTransport.send: request {request_id}: no D has reserved it on this connector")
        frames = [payload] if isinstance(payload, (bytes, bytearray, memoryview)) else list(payload)
        self._send(self._require_router("send"), HANDOFF, request_id, frames, identity)
        del self._identity[request_id]
        self.num_handoffs_sent += 1
        self.kv_bytes_sent += sum(memoryview(f).nbytes for f in frames[1:])

    def poll_ack(self, deadline: Deadline | None = None) -> str | None:
        return self._wait(self._acks, self._drain_router, deadline)

    # ---- counters and shutdown ----

    def refused_counts(self) -> dict[str, int]:
        return dict(self._refused)

    def num_refused(self, reason: str | None = None) -> int:
        """Messages refused (all, or for one of REFUSE_REASONS)."""
        return sum(self._refused.values()) if reason is None else self._refused[reason]

    def close(self) -> None:
        for socket in [*self._dealers.values(), *([self._router] if self._router is not None else [])]:
            socket.close(linger=0)
        self._dealers.clear()
        self._router = None
        self._context.term()

    # ---- internals ----

    def _socket(self, kind: int) -> zmq.Socket:
        socket = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, self._capacity)
        return socket

    def _dealer(self, addr: str) -> zmq.Socket:
        socket = self._dealers.get(addr)
        if socket is None:
            socket = self._dealers[addr] = self._socket(zmq.DEALER)
            socket.connect(f"tcp://{_host_port(addr, 'prefill_addr')}")
        return socket

    def _require_router(self, what: str) -> zmq.Socket:
        if self._router is None:
            raise RuntimeError(f"ZmqTransport.{what}: this connector does not listen (P side needs 'listen')")
        return self._router

    def _send(self, socket: zmq.Socket, kind: str, request_id: str, frames: Sequence, identity: bytes | None = None):
        fields = {"kind": kind, "request_id": request_id, "v": PROTOCOL_VERSION}
        header = canonical_json({**fields, "tag": self._tagger.tag(*_tagged(fields, frames))})
        parts = ([identity] if identity is not None else []) + [header, *frames]
        try:
            socket.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise TransportFullError(f"ZmqTransport: {kind} for request {request_id}: the peer's queue is full "
                                     f"({self._capacity} messages); nothing was sent") from None
        except zmq.ZMQError as error:
            if error.errno != zmq.EHOSTUNREACH:
                raise
            raise TransportFullError(f"ZmqTransport: {kind} for request {request_id}: the peer that reserved it is "
                                     "not connected; nothing was sent") from None

    def _wait(self, queue: collections.deque, drain, deadline: Deadline | None):
        """Pop from `queue`, draining sockets until `deadline` (real time: the deadline's remaining seconds are
        read once, so a virtual clock cannot make this wait forever)."""
        end = time.monotonic() + (deadline.remaining_s() if deadline is not None else 0.0)
        while True:
            drain(0)
            if queue:
                return queue.popleft()
            left = end - time.monotonic()
            if left <= 0:
                return None
            drain(max(1, int(left * 1000)))
            if queue:
                return queue.popleft()

    def _drain_router(self, timeout_ms: int) -> None:
        router = self._require_router("poll")
        if not router.poll(timeout_ms, zmq.POLLIN):
            return
        while len(self._reservations) < self._queue_capacity and len(self._acks) < self._queue_capacity:
            try:
                parts = router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity, message = parts[0].bytes, self._open(parts[1:], "D")
            if message is None:
                continue
            kind, rid, body, error = message
            if error is not None:
                if kind == RESERVE and error == _BAD_TAG:   # tell that D at once, so it fails the request
                    self._send(router, REFUSE, rid, (), identity)
                continue
            if kind == RESERVE:
                self._reserved(identity, rid, body)
            elif kind == ACK:
                self._acks.append(rid)
            else:
                self._refuse("unexpected_kind", rid, f"a {kind} from D")

    def _reserved(self, identity: bytes, rid: str, body: list[memoryview]) -> None:
        data = None
        if body:
            data = _decode_data(body)
            if len(body) != 1 or data is None:
                self._refuse("malformed", rid, "a reservation whose data is not one JSON object frame")
                return
        self._identity[rid] = identity
        self._identity.move_to_end(rid)
        while len(self._identity) > _MAX_IDENTITIES:
            self._identity.popitem(last=False)
        self._reservations.append(Reservation(rid, data))

    def _drain_dealers(self, timeout_ms: int) -> None:
        if not self._dealers:
            time.sleep(timeout_ms / 1000)
            return
        poller = zmq.Poller()
        for socket in self._dealers.values():
            poller.register(socket, zmq.POLLIN)
        ready = dict(poller.poll(timeout_ms))
        for addr, socket in self._dealers.items():
            while socket in ready and len(self._handoffs) < self._queue_capacity:
                try:
                    parts = socket.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                message = self._open(parts, f"P at {addr}")
                if message is None:
                    continue
                kind, rid, body, error = message
                if error is not None or kind == REFUSE:
                    # Nothing of it is used, but a request D reserved at that P fails now, naming the cause,
                    # instead of at its deadline; D's ack then lets P free its blocks.
                    if self._peer_of.get(rid) == addr:
                        error = error or f"P at {addr} refused the reservation: {_BAD_TAG}"
                        self._handoffs.append(Envelope(rid, (), error=error))
                elif kind != HANDOFF:
                    self._refuse("unexpected_kind", rid, f"a {kind} from P at {addr}")
                else:
                    self._peer_of[rid] = addr
                    self._handoffs.append(Envelope(rid, tuple(body)))
                    self.num_handoffs_received += 1

    def _open(self, parts: list, sender: str) -> tuple[str, str, list[memoryview], str | None] | None:
        """Check a received message: (kind, request id, body frames, None when its tag verified, else why it was
        refused: `_BAD_TAG`, or the other protocol version), or None when it is malformed. Every message not
        verified is refused and counted."""
        if not parts:
            return self._refuse("malformed", None, f"an empty message from {sender}")
        try:
            header = json.loads(parts[0].bytes)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return self._refuse("malformed", None, f"a header that is not JSON from {sender}")
        if not isinstance(header, dict) or set(header) != {"kind", "request_id", "tag", "v"}:
            return self._refuse("malformed", None, f"a header without exactly kind/request_id/tag/v from {sender}")
        kind, rid, version = header["kind"], header["request_id"], header["v"]
        if kind not in _KINDS or not isinstance(rid, str) or not 0 < len(rid) <= _MAX_REQUEST_ID:
            return self._refuse("malformed", None, f"kind {kind!r}, version {version!r} from {sender}")
        if version != PROTOCOL_VERSION:
            error = version_error(sender, version)
            self._refuse("version", rid, f"a {kind}: {error}")
            return kind, rid, [], error
        body = [part.buffer for part in parts[1:]]
        fields = {"kind": kind, "request_id": rid, "v": version}
        if not self._tagger.verify(header["tag"], *_tagged(fields, body)):
            self._refuse("bad_tag", rid, f"a {kind} from {sender} whose tag does not verify (wrong or missing "
                                         "shared secret, or a damaged header or reservation frame)")
            return kind, rid, [], _BAD_TAG
        return kind, rid, body, None

    def _refuse(self, reason: str, request_id: str | None, what: str) -> None:
        self._refused[reason] += 1
        logger.warning("PD connector: refused %s (request %s, reason %s)", what, request_id, reason)
        return None


def _tagged(fields: dict, frames: Sequence) -> tuple[bytes, Sequence]:
    """What the message tag covers: the header fields with the frame count, and every body frame except a
    hand-off's KV frames (the hand-off's own tag in its header frame covers those)."""
    return canonical_json({**fields, "frames": len(frames)}), frames[:1] if fields["kind"] == HANDOFF else frames


def _encode_data(request_id: str, data: object) -> bytes:
    if not isinstance(data, dict):
        raise ValueError(f"ZmqTransport.reserve: request {request_id}: argument 'data' must be a dict "
                         f"(got {type(data).__name__})")
    encoded = canonical_json(data)
    if len(encoded) > _MAX_RESERVATION_DATA:
        raise ValueError(f"ZmqTransport.reserve: request {request_id}: argument 'data' is {len(encoded)} bytes of "
                         f"JSON, at most {_MAX_RESERVATION_DATA}")
    return encoded


def _decode_data(body: list[memoryview]) -> dict | None:
    if len(body[0]) > _MAX_RESERVATION_DATA:
        return None
    try:
        data = json.loads(bytes(body[0]))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _host_port(value: str, name: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"ZmqTransport: argument '{name}' must be 'host:port' (got {value!r})")
    return value
