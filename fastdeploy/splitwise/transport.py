"""Moving reservations from D to P, encoded hand-offs from P to D and acknowledgements back (PD_MTP_FLOW §2, §4.4,
I10; SERVICES §6, §7).

Reservation rule: D reserves a request's KV blocks first and then tells P (`reserve`); P starts a prefill only for
a request whose reservation it has polled (`poll_reservation`), so P never computes a prompt no D holds blocks for.

Ownership rule: P keeps the KV blocks a hand-off was gathered from until D acknowledges that hand-off (or P's
KV-transfer deadline expires). D acknowledges every hand-off it has taken off the transport, whatever its verdict,
once it no longer needs P's data (KV copied into its own blocks, or the request finished/failed at receipt).

Nothing is ever dropped silently: a full queue raises `TransportFullError` at the sender. The only losses are the
ones a test injects (`Fault.DROP`), and those are counted.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import enum
import threading
from dataclasses import dataclass

from fastdeploy.splitwise.deadline import Clock, Deadline, MonotonicClock
from fastdeploy.splitwise.handoff import HandoffMessage, Payload
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


@dataclass(frozen=True, slots=True)
class Reservation:
    """One reservation as P polls it: the request id, and what D attached to it (None when nothing), e.g. where
    P may write the request's KV (splitwise/mooncake.py `MooncakeKVTransfer.reservation_data`)."""

    request_id: str
    data: dict | None = None


class TransportFullError(RuntimeError):
    """A bounded queue of the transport is full; the caller must fail or retry the request, nothing was sent."""


class HandoffTransport(abc.ABC):
    """P side calls `poll_reservation`, `send` and `poll_ack`; D side calls `reserve`, `poll` and `ack`.

    A `deadline` of None means "do not wait": return what is available now. Deadlines must be on the
    transport's clock. `address` is where peers reach this side ("host:port"), None when they need none.
    """

    address: str | None = None
    # The key a hand-off sent or received over this transport is sealed / verified with: the PD secret's hand-off
    # key when the transport has a secret, the unkeyed one otherwise (HandoffMessage.create / receive_handoff `key`).
    handoff_key: HandoffKey = UNKEYED

    def close(self) -> None:
        """Release what the transport holds (sockets); an in-process transport holds nothing."""

    def refused_counts(self) -> dict[str, int]:
        """Messages this side refused, by reason (a transport that cannot receive a bad message refuses none)."""
        return {}

    @abc.abstractmethod
    def reserve(self, request_id: str, prefill_addr: str | None = None, data: dict | None = None) -> None:
        """D: blocks for `request_id` are reserved; tell the P at `prefill_addr` (a transport that reaches only
        one P ignores it), with `data` (a JSON object) attached. Raises `TransportFullError` instead of dropping
        it."""

    @abc.abstractmethod
    def poll_reservation(self, deadline: Deadline | None = None) -> str | None:
        """P: the request id of the next reservation (its data dropped), waiting until `deadline` at most; None
        if none."""

    def poll_reservation_with_data(self, deadline: Deadline | None = None) -> Reservation | None:
        """P: the next reservation with the data D attached, waiting until `deadline` at most; None if none. A
        transport that carries no data gives None as the data."""
        request_id = self.poll_reservation(deadline)
        return None if request_id is None else Reservation(request_id)

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


class Fault(enum.Enum):
    """Faults `InProcessTransport` can inject into one sent hand-off (PD_MTP_FLOW I10, O4 last row)."""

    DROP = "drop"  # the message is lost on the way
    STALL = "stall"  # the message becomes visible to D only `stall_s` seconds after it was sent
    CORRUPT = "corrupt"  # one bit of the last byte is flipped (inside the KV bytes when there is KV)
    ONE_DRAFT_ID = "one draft id"  # P behaves as if it had no MTP draft: draft_token_ids = [t0], freshly tagged


@dataclass(frozen=True, slots=True)
class _PlannedFault:
    fault: Fault
    request_id: str | None  # None: the next hand-off, whichever request it is for
    stall_s: float


@dataclass(frozen=True, slots=True)
class _InFlight:
    envelope: Envelope
    visible_at: float  # clock time from which D may receive it


class InProcessTransport(HandoffTransport):
    """Two bounded FIFO queues between a P side and a D side in one process, with fault injection for tests.

    A stalled hand-off does not hold back the ones sent after it; otherwise delivery is in send order.
    """

    def __init__(self, capacity: int = 64, ack_capacity: int = 1024, clock: Clock | None = None) -> None:
        for name, value in (("capacity", capacity), ("ack_capacity", ack_capacity)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"InProcessTransport: argument '{name}' must be an int >= 1 (got {value!r})")
        self._capacity = capacity
        self._ack_capacity = ack_capacity
        self._clock = clock if clock is not None else MonotonicClock()
        self._cond = threading.Condition()
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        self._acks: collections.deque[str] = collections.deque()
        self._reservations: collections.deque[Reservation] = collections.deque()
        self._faults: list[_PlannedFault] = []
        self._num_dropped = 0

    def inject_fault(self, fault: Fault, *, request_id: str | None = None, stall_s: float = 0.0) -> None:
        """Apply `fault` once, to the next hand-off sent for `request_id` (any request when None)."""
        if not isinstance(fault, Fault):
            raise ValueError(f"InProcessTransport.inject_fault: argument 'fault' must be a Fault (got {fault!r})")
        if fault is Fault.STALL and not stall_s > 0:
            raise ValueError(f"InProcessTransport.inject_fault: argument 'stall_s' must be > 0 for a stall "
                             f"(got {stall_s!r})")
        with self._cond:
            self._faults.append(_PlannedFault(fault, request_id, float(stall_s)))

    @property
    def num_dropped(self) -> int:
        """Hand-offs lost to an injected `Fault.DROP`."""
        with self._cond:
            return self._num_dropped

    def num_in_flight(self) -> int:
        """Hand-offs sent but not yet polled by D (stalled ones included)."""
        with self._cond:
            return len(self._in_flight)

    def num_pending_acks(self) -> int:
        with self._cond:
            return len(self._acks)

    def num_pending_reservations(self) -> int:
        with self._cond:
            return len(self._reservations)

    def reserve(self, request_id: str, prefill_addr: str | None = None, data: dict | None = None) -> None:
        if data is not None and not isinstance(data, dict):
            raise ValueError(f"InProcessTransport.reserve: argument 'data' must be a dict or None "
                             f"(got {type(data).__name__})")
        with self._cond:
            if len(self._reservations) >= self._ack_capacity:
                raise TransportFullError(
                    f"InProcessTransport.reserve: reservation queue is full ({self._ack_capacity} not yet read "
                    f"by P); the reservation for request {request_id} was not sent")
            self._reservations.append(Reservation(request_id, data))
            self._cond.notify_all()

    def poll_reservation(self, deadline: Deadline | None = None) -> str | None:
        reservation = self.poll_reservation_with_data(deadline)
        return None if reservation is None else reservation.request_id

    def poll_reservation_with_data(self, deadline: Deadline | None = None) -> Reservation | None:
        return self._pop_when_ready(self._reservations, deadline)

    def send(self, request_id: str, payload: Payload) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"InProcessTransport.send: argument 'request_id' must be a non-empty str "
                             f"(got {request_id!r})")
        if isinstance(payload, (list, tuple)):
            payload = tuple(payload)
        elif isinstance(payload, (bytes, bytearray)):
            payload = bytes(payload)
        else:
            raise ValueError(f"InProcessTransport.send: argument 'payload' must be bytes or a list of frames "
                             f"(got {type(payload).__name__})")
        with self._cond:
            if len(self._in_flight) >= self._capacity:
                raise TransportFullError(
                    f"InProcessTransport.send: hand-off queue is full ({self._capacity} messages not yet received "
                    f"by D); request {request_id} was not sent")
            planned = self._take_fault(request_id)
            visible_at = self._clock.now()
            if planned is not None:
                if planned.fault is Fault.DROP:
                    self._num_dropped += 1
                    return
                if planned.fault is Fault.STALL:
                    visible_at += planned.stall_s
                else:
                    payload = _damage(planned.fault, payload)
            self._in_flight.append(_InFlight(Envelope(request_id, payload), visible_at))
            self._cond.notify_all()

    def poll(self, deadline: Deadline | None = None) -> Envelope | None:
        with self._cond:
            while True:
                now = self._clock.now()
                for item in self._in_flight:
                    if item.visible_at <= now:
                        self._in_flight.remove(item)
                        return item.envelope
                if deadline is None or deadline.is_expired():
                    return None
                # Wake up no later than the deadline or the first stalled message becoming visible.
                wake_at = min([deadline.expires_at] + [i.visible_at for i in self._in_flight])
                self._clock.wait(self._cond, max(wake_at - now, 0.0))

    def ack(self, request_id: str) -> None:
        with self._cond:
            if len(self._acks) >= self._ack_capacity:
                raise TransportFullError(
                    f"InProcessTransport.ack: acknowledgement queue is full ({self._ack_capacity} not yet read "
                    f"by P); the ack for request {request_id} was not sent")
            self._acks.append(request_id)
            self._cond.notify_all()

    def poll_ack(self, deadline: Deadline | None = None) -> str | None:
        return self._pop_when_ready(self._acks, deadline)

    def _pop_when_ready(self, queue: collections.deque, deadline: Deadline | None):
        with self._cond:
            while not queue:
                if deadline is None or deadline.is_expired():
                    return None
                self._clock.wait(self._cond, deadline.remaining_s())
            return queue.popleft()

    def _take_fault(self, request_id: str) -> _PlannedFault | None:
        for i, planned in enumerate(self._faults):
            if planned.request_id is None or planned.request_id == request_id:
                return self._faults.pop(i)
        return None


def _damage(fault: Fault, payload: Payload) -> Payload:
    """The payload as the fault leaves it, in the form it was sent (bytes or frames)."""
    if fault is Fault.CORRUPT:
        if isinstance(payload, bytes):
            return _flip_last_bit(payload)
        return (*payload[:-1], _flip_last_bit(bytes(payload[-1])))
    # Fault.ONE_DRAFT_ID: a well-formed, correctly tagged message that lacks d1, as a faulty P would send it.
    message = HandoffMessage.decode(payload)
    unsealed = dataclasses.replace(message, draft_token_ids=(message.t0,), tag="")
    sealed = dataclasses.replace(unsealed, tag=unsealed.compute_tag())
    return sealed.encode() if isinstance(payload, bytes) else tuple(sealed.encode_frames())


def _flip_last_bit(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0x01]) if data else b"\x01"
