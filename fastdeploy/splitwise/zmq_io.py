"""The thread that owns a connector's ZeroMQ sockets, and how other threads talk to it (docs/design.md §8).

ZeroMQ sockets are not thread-safe, so one thread uses them all: `CommandQueue` carries posted calls from any thread
to it (a bounded queue: a post it has no room for is refused, as a value, never waited for) and wakes it through a
socket pair it polls next to the ZeroMQ sockets; `Mailbox` hands what it received back (deques under one Condition,
every wait bounded by its deadline). The engine's thread never waits for the I/O thread: what a call's outcome is
comes back through the mailbox (docs/design.md §8, "The engine never waits on the I/O thread").
"""
from __future__ import annotations

import collections
import logging
import socket
import threading
import time
from collections.abc import Callable

from fastdeploy.splitwise.deadline import Deadline

logger = logging.getLogger(__name__)

# How long `close` waits for the I/O thread to stop: far beyond one loop turn (one bounded batch of messages)
CLOSE_TIMEOUT_S = 10.0
# Posted calls the I/O thread has not run yet, at most (each loop turn runs them all, between bounded batches)
MAX_POSTED = 1 << 16


class CommandQueue:
    """Calls to run on the I/O thread, in order, and the wake-up that makes it look."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: collections.deque = collections.deque()
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.owner: threading.Thread | None = None   # the I/O thread (a call from it runs at once)

    @property
    def wake_fd(self) -> int:
        return self._wake_r.fileno()

    def post(self, fn: Callable, *args) -> bool:
        """Run `fn(*args)` on the I/O thread later, without waiting; False (nothing queued) when the transport is
        closed or `MAX_POSTED` calls are queued already. On the I/O thread itself it runs at once."""
        if threading.current_thread() is self.owner:
            fn(*args)
            return True
        with self._lock:
            if self._closed or len(self._calls) >= MAX_POSTED:
                return False
            self._calls.append((fn, args))
        self.wake()
        return True

    def wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass   # the pair is full (the thread has wake-ups pending already) or closed

    def run_pending(self) -> None:
        """On the I/O thread: drain the wake-ups, then run every queued call."""
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        while True:
            with self._lock:
                if not self._calls:
                    return
                fn, args = self._calls.popleft()
            try:
                fn(*args)
            except Exception:   # noqa: BLE001 - one failed call must not stop the others (each reports its own)
                logger.exception("PD connector: a posted call failed on the I/O thread")

    def close(self) -> None:
        """No more calls; those still queued are dropped (the thread has stopped)."""
        with self._lock:
            self._closed = True
            self._calls = collections.deque()
        self._wake_r.close()
        self._wake_w.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def mark_closing(self) -> None:
        with self._lock:
            self._closed = True
        self.wake()


class Mailbox:
    """What the I/O thread received, for the engine's thread to take: bounded deques under one Condition."""

    def __init__(self) -> None:
        self.cond = threading.Condition()

    def put(self, queue: collections.deque, item) -> None:
        with self.cond:
            queue.append(item)
            self.cond.notify_all()

    def take(self, queue: collections.deque, deadline: Deadline | None):
        """Pop from `queue`, waiting until `deadline` (real time: its remaining seconds are read once, so a
        virtual clock cannot make this wait forever)."""
        end = time.monotonic() + (deadline.remaining_s() if deadline is not None else 0.0)
        with self.cond:
            while not queue:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            return queue.popleft()

    def take_all(self, queue: collections.deque) -> list:
        with self.cond:
            items = list(queue)
            queue.clear()
            return items
