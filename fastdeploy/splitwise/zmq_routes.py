"""P's route table for ZmqTransport (SERVICES §7): for each reserved request, the D whose hand-off it is.

A route binds a request to the first D (DEALER identity) that reserved it, with that reservation's nonce, until the
hand-off is acknowledged or P forgets the request. Routes are never evicted, since each may have a hand-off owed:
past a cap (in all, per D, of held reservation data) a reservation is refused as `full`, the cap named. The nonces
of recent reservations are remembered so that a replayed one is refused. Used by the I/O thread only.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

MAX_ROUTES = 65536            # P remembers which D reserved a request until its ack; past that it refuses
MAX_NONCES = 1 << 18          # P remembers the nonces of that many reservations (replays refused)
MAX_ROUTES_PER_PEER = 4096    # routes of one D (one DEALER identity)
MAX_HELD_BYTES_PER_PEER = 64 << 20   # bytes of reservation data held for one D
MAX_HELD_BYTES = 256 << 20           # ... and for all


@dataclass(slots=True)
class Route:
    """Where a request's hand-off goes (the identity of the D that reserved it) and that reservation's nonce;
    `sent` once the hand-off left (the route then waits for the ack)."""

    identity: bytes
    nonce: str
    nbytes: int = 0      # of the reservation's data, held until the route ends
    sent: bool = False


class RouteTable:
    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}
        self._held: collections.Counter[bytes] = collections.Counter()         # routes per D identity
        self._held_bytes: collections.Counter[bytes] = collections.Counter()   # their data bytes per D
        self._held_total = 0                                                   # all routes' data bytes
        self._nonces: collections.OrderedDict[str, None] = collections.OrderedDict()

    def get(self, rid: str) -> Route | None:
        return self._routes.get(rid)

    def __contains__(self, rid: str) -> bool:
        return rid in self._routes

    def is_replay(self, nonce: str) -> bool:
        """Whether a reservation with `nonce` was seen before; remembers it (the oldest forgotten past the cap)."""
        if nonce in self._nonces:
            return True
        self._nonces[nonce] = None
        while len(self._nonces) > MAX_NONCES:
            self._nonces.popitem(last=False)
        return False

    def full(self, identity: bytes, nbytes: int) -> str | None:
        """Which cap one more reservation of `nbytes` from D `identity` would pass (None: none)."""
        if len(self._routes) >= MAX_ROUTES:
            return f"{MAX_ROUTES} reservations (its limit)"
        if self._held[identity] >= MAX_ROUTES_PER_PEER:
            return f"{MAX_ROUTES_PER_PEER} reservations of that D (its limit per D)"
        if self._held_bytes[identity] + nbytes > MAX_HELD_BYTES_PER_PEER:
            return (f"{self._held_bytes[identity]} bytes of that D's reservation data (at most "
                    f"{MAX_HELD_BYTES_PER_PEER})")
        if self._held_total + nbytes > MAX_HELD_BYTES:
            return f"{self._held_total} bytes of reservation data (at most {MAX_HELD_BYTES})"
        return None

    def add(self, rid: str, identity: bytes, nonce: str, nbytes: int) -> None:
        """Bind `rid` to D `identity` (the caller checked `full` and that no route of `rid` exists)."""
        self._routes[rid] = Route(identity, nonce, nbytes)
        self._held[identity] += 1
        self._held_bytes[identity] += nbytes
        self._held_total += nbytes

    def drop(self, rid: str) -> None:
        route = self._routes.pop(rid, None)
        if route is not None:
            self._held[route.identity] -= 1
            self._held_bytes[route.identity] -= route.nbytes
            self._held_total -= route.nbytes
            if not self._held[route.identity]:
                del self._held[route.identity], self._held_bytes[route.identity]
