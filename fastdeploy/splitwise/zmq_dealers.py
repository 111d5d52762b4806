"""D's connections to its P's: one DEALER per P address, whether its handshake completed, and how many are kept
(docs/design.md §8, "Topology" and "A P that never answers holds no slot").

A DEALER is opened on first use and kept in least-recently-used order, at most `max_peers` of them; past that the
least recently used one through which nothing awaits an answer is closed — but only to send a reservation or an
ack: a connection asked for ahead of any reservation (`peer_ready`) closes none, so addresses where nothing
listens, named by many requests, cannot push out the connections to live P's or take turns evicting each other;
the connector closes them once their requests fail (`close_if_idle`). Each has a socket monitor, so the I/O
thread learns when its connection completed the ZMTP handshake (with a PD secret: the P proved it holds it,
peer_auth.py) and when it dropped (libzmq reconnects by itself). The engine's thread reads that state without
waiting (`is_ready`), so D gives a slot only to a request whose P completed a handshake.

Liveness across a partition (SERVICES §6) comes from ZeroMQ heartbeats on every DEALER, not from TCP: D pings P
every HEARTBEAT_IVL_S and drops a connection through which nothing came for HEARTBEAT_TIMEOUT_S (its pings carry
that as their TTL for P's side; in the hosts tests P still held a partitioned hand-off's pieces, and their blocks,
until the link healed). libzmq reconnects at once, each attempt bounded by
CONNECT_TIMEOUT_S and retried at most RECONNECT_IVL_MAX_S apart, so once a partition heals D is connected again
within seconds instead of waiting out TCP's retransmission backoff (up to 120 s between tries). Both directions are
kept alive by any whole message (P's 1 MiB hand-off pieces included), so a link that moves a piece within the
timeout (above 1 Mbit/s) is never cut by a heartbeat; D's pings go against the stream, which they never queue behind.
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable

import zmq
from zmq.utils.monitor import recv_monitor_message

from fastdeploy.splitwise.peer_auth import CurveKeys
from fastdeploy.splitwise.transport import PeerUnreachableError

_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
HEARTBEAT_IVL_S = 2.0
HEARTBEAT_TIMEOUT_S = 10.0     # also the TTL P applies to D's connection
CONNECT_TIMEOUT_S = 2.0
RECONNECT_IVL_MAX_S = 2.0


class Dealers:
    """The sockets and monitors are the I/O thread's alone; `is_ready` and `should_connect` are the engine
    thread's, and the readiness sets are shared under `lock`."""

    def __init__(self, make_socket: Callable[[int], zmq.Socket], curve: CurveKeys | None, max_peers: int,
                 lock: threading.RLock):
        self._make_socket, self._curve, self._max_peers, self._lock = make_socket, curve, max_peers, lock
        self.sockets: collections.OrderedDict[str, zmq.Socket] = collections.OrderedDict()   # LRU first
        self._monitors: dict[str, zmq.Socket] = {}
        self._ready: set[str] = set()    # addresses whose connection completed its handshake
        self._asked: set[str] = set()    # addresses the engine's thread asked to connect to

    # ---- the engine's thread ----

    def is_ready(self, addr: str) -> bool:
        with self._lock:
            return addr in self._ready

    def should_connect(self, addr: str) -> bool:
        """True once per address not ready and not asked for yet (the caller then posts `open`)."""
        with self._lock:
            if addr in self._ready or addr in self._asked:
                return False
            self._asked.add(addr)
            return True

    def forget_asked(self, addr: str) -> None:
        """The connection asked for could not be opened: the next `should_connect` asks again."""
        with self._lock:
            self._asked.discard(addr)

    # ---- the I/O thread ----

    def get(self, addr: str, busy: Callable[[], set[str]] | None) -> zmq.Socket:
        """The DEALER to `addr`, opened if need be (when `max_peers` are open, closing the least recently used one
        not in `busy()`, or none when `busy` is None); PeerUnreachableError when it cannot be opened. `addr` is
        checked by the caller."""
        socket = self.sockets.get(addr)
        if socket is not None:
            self.sockets.move_to_end(addr)
            return socket
        if len(self.sockets) >= self._max_peers:
            if busy is None:
                raise PeerUnreachableError(f"ZmqTransport: D holds {len(self.sockets)} connections to P addresses "
                                           "already (its limit)")
            self._close_idle(busy())
        socket = self._make_socket(zmq.DEALER)
        for option, seconds in ((zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_S), (zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_S),
                                (zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_S), (zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_S),
                                (zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_S)):
            socket.setsockopt(option, int(seconds * 1000))
        if self._curve is not None:
            self._curve.make_client(socket)
        monitor = socket.get_monitor_socket(_EVENTS)   # before connect, so no event is missed
        try:
            socket.connect(f"tcp://{addr}")
        except zmq.ZMQError as error:
            socket.disable_monitor()
            monitor.close(linger=0)
            socket.close(linger=0)
            raise PeerUnreachableError(f"ZmqTransport: cannot connect to P at {addr}: {error}") from None
        self.sockets[addr], self._monitors[addr] = socket, monitor
        return socket

    def close(self, addr: str) -> None:
        socket = self.sockets.pop(addr)
        socket.disable_monitor()
        self._monitors.pop(addr).close(linger=0)
        socket.close(linger=0)
        with self._lock:
            self._ready.discard(addr)
            self._asked.discard(addr)

    def close_if_idle(self, addr: str, busy: set[str]) -> None:
        """Close the DEALER to `addr` unless it is in `busy` or completed its handshake."""
        if addr in self.sockets and addr not in busy and not self.is_ready(addr):
            self.close(addr)

    def close_all(self) -> None:
        for addr in list(self.sockets):
            self.close(addr)

    def monitors(self) -> Iterable[zmq.Socket]:
        return self._monitors.values()

    def take_events(self, ready: dict) -> None:
        """Note the handshakes completed and the connections dropped that the monitors in `ready` (a poll's
        result) report."""
        for addr, monitor in list(self._monitors.items()):
            while monitor in ready:
                try:
                    event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
                except zmq.Again:
                    break
                with self._lock:   # D's idle step waits at most IDLE_POLL_S, so it asks again soon
                    if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                        self._ready.add(addr)
                    else:
                        self._ready.discard(addr)

    def _close_idle(self, busy: set[str]) -> None:
        idle = next((addr for addr in self.sockets if addr not in busy), None)
        if idle is None:
            raise PeerUnreachableError(f"ZmqTransport: D already awaits answers from {len(self.sockets)} distinct "
                                       "P addresses (its limit); try again when some are answered")
        self.close(idle)
