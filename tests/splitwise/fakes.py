"""Test doubles for the P→D connector: virtual time, and an in-process transport that injects faults into the
hand-offs it carries (PD_MTP_FLOW I10, O4 last row). The package never imports this module."""
from __future__ import annotations

import dataclasses
import enum
import threading
from dataclasses import dataclass

from fastdeploy.splitwise import Clock, Deadline, Envelope, HandoffMessage, InProcessTransport, Payload
from fastdeploy.splitwise.transport import check_payload


class FakeClock(Clock):
    """Virtual time for tests: moves only through `advance()` and `wait()`.

    `wait()` does not block: it advances virtual time by the full timeout, as if nothing arrived meanwhile.
    That makes "the message came too late" deterministic without sleeping.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = float(start_s)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"FakeClock.advance: argument 'seconds' must be >= 0 (got {seconds})")
        with self._lock:
            self._now += seconds

    def wait(self, cond: threading.Condition, timeout_s: float) -> None:
        self.advance(max(timeout_s, 0.0))


class Fault(enum.Enum):
    """Faults `FaultyTransport` can inject into one sent hand-off."""

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
class _Stalled:
    envelope: Envelope
    visible_at: float  # clock time from which D may receive it


class FaultyTransport(InProcessTransport):
    """`InProcessTransport` plus `inject_fault`. A stalled hand-off does not hold back the ones sent after it;
    otherwise delivery is in send order."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._faults: list[_PlannedFault] = []
        self._stalled: list[_Stalled] = []
        self.num_dropped = 0   # hand-offs lost to an injected Fault.DROP

    def inject_fault(self, fault: Fault, *, request_id: str | None = None, stall_s: float = 0.0) -> None:
        """Apply `fault` once, to the next hand-off sent for `request_id` (any request when None)."""
        if not isinstance(fault, Fault):
            raise ValueError(f"FaultyTransport.inject_fault: argument 'fault' must be a Fault (got {fault!r})")
        if fault is Fault.STALL and not stall_s > 0:
            raise ValueError(f"FaultyTransport.inject_fault: argument 'stall_s' must be > 0 for a stall "
                             f"(got {stall_s!r})")
        self._faults.append(_PlannedFault(fault, request_id, float(stall_s)))

    def num_in_flight(self) -> int:
        return super().num_in_flight() + len(self._stalled)

    def send(self, request_id: str, payload: Payload) -> None:
        payload = check_payload("FaultyTransport.send", request_id, payload)
        planned = next((f for f in self._faults if f.request_id in (None, request_id)), None)
        if planned is None:
            return super().send(request_id, payload)
        if super().num_in_flight() + len(self._stalled) >= self._capacity:
            return super().send(request_id, payload)     # raises TransportFullError; the fault stays planned
        self._faults.remove(planned)
        if planned.fault is Fault.DROP:
            self.num_dropped += 1
        elif planned.fault is Fault.STALL:
            self._stalled.append(_Stalled(Envelope(request_id, payload), self.clock.now() + planned.stall_s))
        else:
            super().send(request_id, _damage(planned.fault, payload))

    def poll(self, deadline: Deadline | None = None) -> Envelope | None:
        """Stalled hand-offs join the queue once their time came; a wait wakes no later than the first of them."""
        while True:
            now = self.clock.now()
            for item in [i for i in self._stalled if i.visible_at <= now]:
                self._stalled.remove(item)
                super().send(item.envelope.request_id, item.envelope.payload)
            wake = min([i.visible_at for i in self._stalled], default=None)
            if deadline is not None and wake is not None and wake < deadline.expires_at:
                envelope = super().poll(Deadline(self.clock, wake))
                if envelope is not None:
                    return envelope
                continue
            return super().poll(deadline)


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


def reservation_ids(transport):
    """`poll(deadline)` of the ids of `transport`'s reservations (their data dropped)."""
    return lambda deadline=None: getattr(transport.poll_reservation_with_data(deadline), "request_id", None)
