"""D's view of which P's answer (SERVICES §6 "a P that completes a connection but never answers", docs/design.md
§8 "A P that never answers holds no slot").

A completed handshake proves that a P is there (with a PD secret: that it holds the secret), not that it answers: a
P whose connector is wedged, or a peer that holds the secret and stays silent, would otherwise take a slot of D's
for every request naming it until each reservation's acknowledgement deadline. So D takes slots for a P only once
it has answered: to a P that has not (a new connection, or one whose reservation went unacknowledged) D sends one
reservation, the probe, and the later requests for that P wait without a slot or blocks. P's first answer (it
acknowledges or refuses a reservation, or sends a hand-off) lifts the limit; the probe's acknowledgement deadline
passing unanswered makes the P silent again, and the decode connector then fails every request waiting for it at
once. Used by the engine's thread only.
"""
from __future__ import annotations


class AnsweringPeers:
    """The P addresses that answered since they last went silent, and the one probe of each that has not."""

    def __init__(self) -> None:
        self._answering: set[str] = set()
        self._probes: dict[str, str] = {}   # P address -> the request whose reservation probes it

    def may_reserve(self, addr: str) -> bool:
        """Whether a request for the P at `addr` may take a slot now: P answered, or no probe awaits its answer."""
        return addr in self._answering or addr not in self._probes

    def reserved(self, addr: str, request_id: str) -> None:
        """A reservation of `request_id` was sent to `addr`; it is the probe when that P has not answered."""
        if addr not in self._answering:
            self._probes.setdefault(addr, request_id)

    def answered(self, addr: str) -> None:
        """The P at `addr` answered a reservation: its requests take slots without limit."""
        self._answering.add(addr)
        self._probes.pop(addr, None)

    def ended(self, addr: str, request_id: str) -> None:
        """`request_id` no longer awaits its P (answered, failed, aborted): the next request may probe."""
        if self._probes.get(addr) == request_id:
            del self._probes[addr]

    def silent(self, addr: str) -> None:
        """A reservation at `addr` went unacknowledged past its deadline: the next request for that P probes it."""
        self._answering.discard(addr)
        self._probes.pop(addr, None)

    def disconnected(self, addr: str) -> None:
        """The connection to `addr` dropped: what answers there once it is back is probed first (a probe sent
        already stays the probe until it is answered or its deadline passes)."""
        self._answering.discard(addr)
