"""Moving reservations from D to P, encoded hand-offs from P to D and acknowledgements back (PD_MTP_FLOW §2, §4.4,
I10; SERVICES §6, §7).

Reservation rule: D reserves a request's KV blocks first and then tells P (`reserve`); P starts a prefill only for
a request whose reservation it has polled (`poll_reservation_with_data`), so P never computes a prompt no D holds blocks for.

Acknowledgement rule: P awaits D's acknowledgement of every hand-off (or P's KV-transfer deadline). D acknowledges
every hand-off it has taken off the transport, whatever its verdict, once it no longer needs P's data (KV copied
into its own blocks, or the request finished/failed at receipt). Blocks are never the transport's: each side's
resource manager owns them (docs/design.md §6).

Nothing is ever dropped silently: a reservation a full queue refuses is refused as `reserve`'s return value; a
hand-off a full queue refuses raises `TransportFullError` at the sender (in-process) or is held and retried by the
transport's thread, which reports it at `finished_sends` (ZeroMQ, `reports_sends`).
"""

from __future__ import annotations

import abc
import collections
import threading
from dataclasses import dataclass

import msgspec

from fastdeploy.splitwise.deadline import Clock, Deadline, MonotonicClock
from fastdeploy.splitwise.handoff import Payload
from fastdeploy.splitwise.integrity import UNKEYED, HandoffKey


@dataclass(frozen=True, slots=True)
class Envelope:
    """One delivered hand-off: the request id it was sent for, and the encoded message (as sent: bytes or
    frames; HandoffMessage.decode reads both)."""

    request_id: str
    payload: Payload
    # Set instead of a usable payload when the transport refused what arrived for this request (a hand-off that
    # failed the connector's tag check, or P refusing D's reservation): D fails the request with it at once.
    error: str | None = None
    # A streamed hand-off (kv_stream.py): this many KV bytes were written into the request's blocks (its landing)
    # and the tag in `payload` was verified over them as they arrived; None for a hand-off delivered whole.
    kv_landed: int | None = None
    # The reservation never left D (no connection to that P could be opened, D awaits too many P's): no answer of
    # P's follows, nothing is to be acknowledged; `error` says why.
    unsent: bool = False


@dataclass(frozen=True, slots=True)
class Reservation:
    """One reservation as P polls it: the request id, and what D attached to it (`data`: None when nothing),
    e.g. where P may write the request's KV (splitwise/mooncake.py `MooncakeKVTransfer.reservation_data`). The
    data is kept as the JSON D sent (`encoded`, checked to be an object) and decoded where it is used: a decoded
    object takes several times its JSON's memory, and P may hold many reservations before their requests come."""

    request_id: str
    encoded: bytes | None = None

    @classmethod
    def of(cls, request_id: str, data: dict | None) -> Reservation:
        return cls(request_id, None if data is None else msgspec.json.encode(data))

    @property
    def data(self) -> dict | None:
        return None if self.encoded is None else msgspec.json.decode(self.encoded)


class TransportFullError(RuntimeError):
    """A bounded queue of the transport is full; the caller must fail or retry the request, nothing was sent."""


class PeerUnreachableError(RuntimeError):
    """The peer cannot be reached for this request, and retrying will not change that (the D that reserved it
    disconnected, or D cannot open a connection to the P named); nothing was sent: the caller fails the request."""


class HandoffTransport(abc.ABC):
    """P side calls `poll_reservation_with_data`, `send` and `poll_ack`; D side calls `reserve`, `poll` and `ack`.

    A `deadline` of None means "do not wait": return what is available now. Deadlines must be on the
    transport's clock. `address` is where peers reach this side ("host:port"), None when they need none;
    `needs_peer_address` says whether D must name the P it reserves at (`reserve`'s `prefill_addr`).
    """

    address: str | None = None
    needs_peer_address = False
    # P acknowledges each reservation as it arrives (D then fails one nobody acknowledged at its short deadline);
    # a transport that cannot lose a reservation on the way (in-process) does not.
    acknowledges_reservations = False
    # The key a hand-off sent or received over this transport is sealed / verified with: the PD secret's hand-off
    # key when the transport has a secret, the unkeyed one otherwise (HandoffMessage.create / receive_handoff `key`).
    handoff_key: HandoffKey = UNKEYED

    def close(self) -> None:
        """Release what the transport holds (sockets); an in-process transport holds nothing."""

    def refused_counts(self) -> dict[str, int]:
        """Messages this side refused, by reason (a transport that cannot receive a bad message refuses none)."""
        return {}

    def has_mail(self) -> bool:
        """Something a peer sent waits to be polled (an idle instance steps to take it in: its transport stops
        reading a socket whose inbound queue is full, so unpolled mail would hold up every later message)."""
        return False

    def take_accepted(self) -> list[str]:
        """D: the request ids whose reservation P acknowledged since the previous call (read while polling)."""
        return []

    def peer_ready(self, prefill_addr: str) -> bool:
        """D: whether the P at `prefill_addr` can take a reservation now (a connection to it completed its
        handshake); asking starts a connection where none is open. Never waits."""
        return True

    def drop_peer(self, prefill_addr: str) -> None:
        """D: the P at `prefill_addr` never became ready and D failed its requests: let its connection go."""

    # P: `send` returns at once and `finished_sends` reports every hand-off sent whole (sent, or why not): a
    # transport with its own thread (ZeroMQ). Otherwise `send` is done when it returns, or raises.
    reports_sends = False

    def refuse(self, request_id: str, reason: str) -> None:
        """P: P will not write the hand-off of `request_id` (`reason`: peer_message.WILL_NOT_WRITE): D, told at once,
        ends the request, or the quarantine of its blocks, without waiting for a deadline; then `forget`. A
        transport whose D cannot be left waiting (in-process: P and D end requests together) only forgets."""
        self.forget(request_id)

    def forget(self, request_id: str) -> None:
        """The request is over on this side without a completed exchange (P: no hand-off will be sent, its route
        goes, and its streamed hand-off stops, reported by `finished_sends` with an error; D: it no longer awaits
        P's answer, which no longer holds a connection open)."""

    # A transport that streams (`streams_kv`) moves an inline hand-off's KV in pieces on its own thread
    # (kv_stream.py, SERVICES §7): P hands it the stream and learns at `finished_sends` when its blocks are no
    # longer read; D registers where each request's KV lands before reserving, and the transport writes it there.
    streams_kv = False

    def send_stream(self, request_id: str, stream) -> None:
        """P: send a hand-off in pieces (kv_stream.OutgoingStream), reading its KV while it goes out; returns at
        once, and `finished_sends` reports the stream done or failed (also one that could not start)."""
        raise NotImplementedError(f"{type(self).__name__} does not stream hand-offs")

    def finished_sends(self) -> list[tuple[str, str | None]]:
        """P: streams done since the last call (request id, None or why it failed); their KV is no longer read."""
        return []

    def expect_kv(self, request_id: str, landing) -> None:
        """D: a streamed hand-off for `request_id` lands in `landing` (kv_stream.Landing: views of its blocks)."""

    def release_kv(self, request_id: str) -> None:
        """D: nothing more is written into the landing of `request_id` once this returns."""

    @abc.abstractmethod
    def reserve(self, request_id: str, prefill_addr: str | None = None, data: dict | None = None) -> str | None:
        """D: blocks for `request_id` are reserved; tell the P at `prefill_addr` (a transport that reaches only
        one P ignores it), with `data` (a JSON object) attached. Returns None when the reservation is on its way,
        or why it is refused now (that P's queue is full: retry later); never waits for the peer. A reservation
        that later turns out undeliverable comes back through `poll` as an Envelope with `error`."""

    @abc.abstractmethod
    def poll_reservation_with_data(self, deadline: Deadline | None = None) -> Reservation | None:
        """P: the next reservation with the data D attached, waiting until `deadline` at most; None if none."""

    @abc.abstractmethod
    def send(self, request_id: str, payload: Payload) -> None:
        """P: queue an encoded hand-off for D. Raises `TransportFullError` instead of dropping it."""

    @abc.abstractmethod
    def poll(self, deadline: Deadline | None = None) -> Envelope | None:
        """D: the next hand-off, waiting until `deadline` at most; None when none arrived in time."""

    @abc.abstractmethod
    def ack(self, request_id: str) -> None:
        """D: release P from owning the blocks behind the hand-off for `request_id`."""

    @abc.abstractmethod
    def poll_ack(self, deadline: Deadline | None = None) -> str | None:
        """P: the request id of the next acknowledgement, waiting until `deadline` at most; None if none."""


class InProcessTransport(HandoffTransport):
    """Bounded FIFO queues between a P side and a D side in one process (both driven by one thread, or by two)."""

    def __init__(self, capacity: int = 64, ack_capacity: int = 1024, clock: Clock | None = None) -> None:
        for name, value in (("capacity", capacity), ("ack_capacity", ack_capacity)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"InProcessTransport: argument '{name}' must be an int >= 1 (got {value!r})")
        self._capacity = capacity
        self._ack_capacity = ack_capacity
        self.clock = clock if clock is not None else MonotonicClock()
        self._cond = threading.Condition()
        self._in_flight: collections.deque[Envelope] = collections.deque()
        self._acks: collections.deque[str] = collections.deque()
        self._reservations: collections.deque[Reservation] = collections.deque()

    def num_in_flight(self) -> int:
        """Hand-offs sent but not yet polled by D."""
        with self._cond:
            return len(self._in_flight)

    def num_pending_acks(self) -> int:
        with self._cond:
            return len(self._acks)

    def num_pending_reservations(self) -> int:
        with self._cond:
            return len(self._reservations)

    def reserve(self, request_id: str, prefill_addr: str | None = None, data: dict | None = None) -> str | None:
        if data is not None and not isinstance(data, dict):
            raise ValueError(f"InProcessTransport.reserve: argument 'data' must be a dict or None "
                             f"(got {type(data).__name__})")
        try:
            self._push(self._reservations, Reservation.of(request_id, data), self._ack_capacity,
                       f"InProcessTransport.reserve: reservation queue is full ({self._ack_capacity} not yet read "
                       f"by P); the reservation for request {request_id} was not sent")
        except TransportFullError as error:
            return str(error)
        return None

    def poll_reservation_with_data(self, deadline: Deadline | None = None) -> Reservation | None:
        return self._pop_when_ready(self._reservations, deadline)

    def send(self, request_id: str, payload: Payload) -> None:
        envelope = Envelope(request_id, check_payload("InProcessTransport.send", request_id, payload))
        self._push(self._in_flight, envelope, self._capacity,
                   f"InProcessTransport.send: hand-off queue is full ({self._capacity} messages not yet received "
                   f"by D); request {request_id} was not sent")

    def poll(self, deadline: Deadline | None = None) -> Envelope | None:
        return self._pop_when_ready(self._in_flight, deadline)

    def ack(self, request_id: str) -> None:
        self._push(self._acks, request_id, self._ack_capacity,
                   f"InProcessTransport.ack: acknowledgement queue is full ({self._ack_capacity} not yet read by "
                   f"P); the ack for request {request_id} was not sent")

    def poll_ack(self, deadline: Deadline | None = None) -> str | None:
        return self._pop_when_ready(self._acks, deadline)

    def _push(self, queue: collections.deque, item, capacity: int, full: str) -> None:
        with self._cond:
            if len(queue) >= capacity:
                raise TransportFullError(full)
            queue.append(item)
            self._cond.notify_all()

    def _pop_when_ready(self, queue: collections.deque, deadline: Deadline | None):
        with self._cond:
            while not queue:
                if deadline is None or deadline.is_expired():
                    return None
                self.clock.wait(self._cond, deadline.remaining_s())
            return queue.popleft()


def check_payload(owner: str, request_id: object, payload: object) -> Payload:
    """A hand-off as `send` takes it: bytes, or a tuple of frames; ValueError naming the argument otherwise."""
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"{owner}: argument 'request_id' must be a non-empty str (got {request_id!r})")
    if isinstance(payload, (list, tuple)):
        return tuple(payload)
    if isinstance(payload, (bytes, bytearray)):
        return bytes(payload)
    raise ValueError(f"{owner}: argument 'payload' must be bytes or a list of frames "
                     f"(got {type(payload).__name__})")
