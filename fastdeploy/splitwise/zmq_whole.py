"""P's whole hand-offs, the half of ZmqTransport that sends them (SERVICES §7), run on its I/O thread: a hand-off
sent whole (a placed one, or one without KV) goes out at once, or waits behind its D's earlier ones while that D's
queue is full, in order per D and never delaying another D's; P holds at most `MAX_QUEUED_BYTES` of them per D.
"""
from __future__ import annotations

import collections

from fastdeploy.splitwise.peer_message import HANDOFF
from fastdeploy.splitwise.transport import PeerUnreachableError, TransportFullError

# P holds at most this many bytes of whole hand-offs for one D whose queue is full (past it a send fails)
MAX_QUEUED_BYTES = 64 << 20


class WholeSendingHalf:
    """Mixed into ZmqTransport: it provides `_send`, `_route_to_send`, `_require_router`, `_routes`, `_router`,
    `_mail`, `_sent`, `_unsent` and `kv_bytes_sent`."""

    def _send_whole(self, rid: str, frames: list) -> None:
        """A hand-off sent whole, posted by `send`: sent now, or queued behind its D's earlier ones while that D's
        queue is full (in order per D, never delaying another D's); reported at `finished_sends`."""
        try:
            route = self._route_to_send(rid, "send")
            self._require_router("send")
        except (ValueError, RuntimeError) as error:
            self._mail.put(self._sent, (rid, str(error)))
            return
        queue = self._unsent.setdefault(route.identity, collections.deque())
        queued = sum(_nbytes(f) for _, held in queue for f in held)
        if queued + sum(_nbytes(f) for f in frames) > MAX_QUEUED_BYTES:
            self._mail.put(self._sent, (rid, f"ZmqTransport.send: request {rid}: P holds {queued} bytes of hand-offs "
                                            f"for that D already, whose queue is full (at most {MAX_QUEUED_BYTES})"))
            if not queue:
                del self._unsent[route.identity]
            return
        queue.append((rid, frames))
        if len(queue) == 1:
            self._send_queued(route.identity, queue)

    def _send_unsent(self) -> tuple[bool, bool]:
        """Retry the whole hand-offs a full queue held, oldest first per D; (any sent, any still held)."""
        progressed = False
        for identity, queue in list(self._unsent.items()):
            before = len(queue)
            self._send_queued(identity, queue)
            progressed = progressed or len(queue) < before
        return progressed, bool(self._unsent)

    def _send_queued(self, identity: bytes, queue: collections.deque) -> None:
        while queue:
            rid, frames = queue[0]
            route = self._routes.get(rid)
            if route is None or route.sent:   # forgotten meanwhile: nothing is sent for it
                queue.popleft()
                continue
            try:
                self._send(self._router, HANDOFF, rid, route.nonce, frames, identity)
            except TransportFullError:
                return
            except PeerUnreachableError as error:
                queue.popleft()
                self._mail.put(self._sent, (rid, str(error)))
                continue
            queue.popleft()
            route.sent = True
            self.kv_bytes_sent += sum(memoryview(f).nbytes for f in frames[1:])
            self._mail.put(self._sent, (rid, None))
        del self._unsent[identity]


def _nbytes(frame) -> int:
    return memoryview(frame).nbytes
