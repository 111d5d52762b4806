"""Bounded waits for the P→D hand-off: clocks, deadlines and the table of waits in flight (PD_MTP_FLOW §3, I10).

Every cross-instance wait has a deadline and a reclaim path. The waiting side registers the wait in a
`PendingWaits` table; each engine step it pops the expired ones and fails those requests, freeing what it holds.
Time comes from a `Clock`, so tests drive deadlines with virtual time instead of sleeping.

The two waits that span the KV's move (D's PREFILL_RESULT, P's KV_TRANSFER) scale with the bytes: their deadline
is the configured timeout plus the time the hand-off's KV takes at a floor rate (`min_transfer_mbps`, SERVICES §6),
so a long prompt over a slow link is given the time its bytes need, and a link slower than the floor fails the
hand-off at a deadline the error states, never a fixed timeout chosen for small prompts on fast links.
"""

from __future__ import annotations

import abc
import enum
import threading
import time
from dataclasses import dataclass


class Clock(abc.ABC):
    """Source of monotonic time in seconds, plus the one blocking primitive waits are built on."""

    @abc.abstractmethod
    def now(self) -> float:
        """Current time in seconds (monotonic; the origin is arbitrary)."""

    @abc.abstractmethod
    def wait(self, cond: threading.Condition, timeout_s: float) -> None:
        """Wait on `cond` (held by the caller) for at most `timeout_s` seconds or until notified."""


class MonotonicClock(Clock):
    """Real time: `time.monotonic()`; waits block on the condition."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, cond: threading.Condition, timeout_s: float) -> None:
        cond.wait(timeout_s)


@dataclass(frozen=True, slots=True)
class Deadline:
    """A point in time on a given clock after which a wait has failed."""

    clock: Clock
    expires_at: float

    @classmethod
    def after(cls, clock: Clock, seconds: float) -> Deadline:
        if seconds < 0:
            raise ValueError(f"Deadline.after: argument 'seconds' must be >= 0 (got {seconds})")
        return cls(clock, clock.now() + seconds)

    def remaining_s(self) -> float:
        """Seconds left; 0 once expired (never negative)."""
        return max(self.expires_at - self.clock.now(), 0.0)

    def is_expired(self) -> bool:
        return self.clock.now() >= self.expires_at


class WaitKind(enum.Enum):
    """The cross-instance waits of PD_MTP_FLOW §3 and SERVICES §6, named after what is awaited."""

    DECODE_ALLOCATION = "decode allocation"  # request assigned to D, waiting for D to preallocate its KV blocks
    KV_TRANSFER = "KV transfer"  # P sent the hand-off and keeps its blocks until D acknowledges it
    PREFILL_RESULT = "prefill result"  # D preallocated, waiting for P's hand-off message
    # P holds a request without D's reservation for it, or a reservation without the request (SERVICES §6 step 3)
    RESERVATION = "reservation match"
    RESERVATION_ACK = "reservation acknowledgement"  # D sent its reservation, P has not acknowledged it yet


# The waits whose deadline grows with the hand-off's KV bytes (the KV moves while they last).
SCALED_BY_KV = frozenset({WaitKind.KV_TRANSFER, WaitKind.PREFILL_RESULT})


@dataclass(frozen=True, slots=True)
class HandoffDeadlines:
    """Timeout per wait kind, in seconds.

    Defaults: 300 s for the prefill result (FastDeploy's FD_GET_FIRST_TOKEN_FROM_P_TIMEOUT, #5338: it spans P's
    queueing and prefill); 60 s for the decode allocation and for D's acknowledgement of a sent hand-off; 90 s for
    P's match of a request with D's reservation (longer than the decode allocation that precedes the reservation);
    5 s for P to acknowledge D's reservation (P does at once; a request paired with an address no P serves then
    fails in seconds instead of holding D's slot for the prefill result's 300 s, docs/design.md §8).

    `min_transfer_mbps` (Mbit/s, default 100) is the floor rate of the hand-off's KV: the prefill result and KV
    transfer waits each get `8 * kv_bytes / (min_transfer_mbps * 1e6)` seconds on top of their timeout.
    """

    decode_allocation_s: float = 60.0
    kv_transfer_s: float = 60.0
    prefill_result_s: float = 300.0
    reservation_s: float = 90.0
    reservation_ack_s: float = 5.0
    min_transfer_mbps: float = 100.0

    def __post_init__(self) -> None:
        for name in ("decode_allocation_s", "kv_transfer_s", "prefill_result_s", "reservation_s",
                     "reservation_ack_s", "min_transfer_mbps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"HandoffDeadlines: field '{name}' must be a number > 0 (got {value!r})")

    def transfer_allowance_s(self, kv_bytes: int) -> float:
        """Seconds `kv_bytes` of KV take at the floor rate."""
        return 8.0 * kv_bytes / (self.min_transfer_mbps * 1e6)

    def timeout_s(self, kind: WaitKind, kv_bytes: int = 0) -> float:
        """The wait's timeout; for a wait the KV moves in, plus the time `kv_bytes` take at the floor rate."""
        return self.base_timeout_s(kind) + (self.transfer_allowance_s(kv_bytes) if kind in SCALED_BY_KV else 0.0)

    def base_timeout_s(self, kind: WaitKind) -> float:
        return {
            WaitKind.DECODE_ALLOCATION: self.decode_allocation_s,
            WaitKind.KV_TRANSFER: self.kv_transfer_s,
            WaitKind.PREFILL_RESULT: self.prefill_result_s,
            WaitKind.RESERVATION: self.reservation_s,
            WaitKind.RESERVATION_ACK: self.reservation_ack_s,
        }[kind]


@dataclass(frozen=True, slots=True)
class ExpiredWait:
    """A wait that ran past its deadline; `error` is the text to fail the request with."""

    request_id: str
    kind: WaitKind
    timeout_s: float             # the whole timeout, scaling included
    kv_bytes: int = 0            # the hand-off's KV the deadline was scaled by (0: not scaled)
    base_s: float = 0.0          # the timeout before scaling (read only when kv_bytes)
    floor_mbps: float = 0.0      # the floor rate it was scaled at

    @property
    def error(self) -> str:
        base_s = self.base_s if self.kv_bytes else self.timeout_s
        error = f"PD: request {self.request_id}: {self.kind.value} did not complete within {base_s:g} s"
        if not self.kv_bytes:
            return error
        return (f"{error} + {self.timeout_s - self.base_s:.3g} s for its {self.kv_bytes} bytes of KV at the "
                f"{self.floor_mbps:g} Mbit/s floor (--pd-min-transfer-mbps)")


class PendingWaits:
    """The waits one instance has in flight, at most one per request id. Thread-safe.

    Liveness (PD_MTP_FLOW O3) requires this table to be empty once a workload has drained.
    """

    def __init__(self, clock: Clock, deadlines: HandoffDeadlines) -> None:
        self._clock = clock
        self._deadlines = deadlines
        self._waits: dict[str, tuple[WaitKind, Deadline, int]] = {}   # id -> (kind, deadline, KV bytes)
        self._lock = threading.Lock()

    def start(self, request_id: str, kind: WaitKind, kv_bytes: int = 0) -> Deadline:
        """Register a wait; its deadline is now + the configured timeout for `kind`, scaled by the hand-off's
        `kv_bytes` for the waits the KV moves in."""
        if kind not in SCALED_BY_KV:
            kv_bytes = 0
        deadline = Deadline.after(self._clock, self._deadlines.timeout_s(kind, kv_bytes))
        with self._lock:
            if request_id in self._waits:
                held = self._waits[request_id][0].value
                raise ValueError(f"PendingWaits.start: request {request_id} already waits for {held}")
            self._waits[request_id] = (kind, deadline, kv_bytes)
        return deadline

    def finish(self, request_id: str) -> WaitKind | None:
        """End the request's wait; returns its kind, or None when it had none (e.g. it expired already)."""
        with self._lock:
            entry = self._waits.pop(request_id, None)
        return None if entry is None else entry[0]

    def pop_expired(self) -> list[ExpiredWait]:
        """Remove and return every wait whose deadline has passed, in registration order."""
        with self._lock:
            expired = [rid for rid, (_, deadline, _) in self._waits.items() if deadline.is_expired()]
            entries = [(rid, *self._waits.pop(rid)[::2]) for rid in expired]
        d = self._deadlines
        return [ExpiredWait(rid, kind, d.timeout_s(kind, nbytes), nbytes, d.base_timeout_s(kind),
                            d.min_transfer_mbps) for rid, kind, nbytes in entries]

    def ids_of(self, kind: WaitKind) -> list[str]:
        """The ids waiting for `kind`, in registration order."""
        with self._lock:
            return [rid for rid, (k, _, _) in self._waits.items() if k is kind]

    def __contains__(self, request_id: object) -> bool:
        with self._lock:
            return request_id in self._waits

    def __len__(self) -> int:
        with self._lock:
            return len(self._waits)
