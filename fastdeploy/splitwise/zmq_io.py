"""The thread that owns a connector's ZeroMQ sockets, and how other threads talk to it (docs/design.md §8).

ZeroMQ sockets are not thread-safe, so one thread uses them all: `CommandQueue` carries calls from any thread to it
(each answered through a Future, with a bounded wait) and wakes it through a socket pair it polls next to the ZeroMQ
sockets; `Mailbox` hands what it received back (deques under one Condition, every wait bounded by its deadline).
"""
from __future__ import annotations

import collections
import concurrent.futures
import socket
import threading
import time
from collections.abc import Callable

from fastdeploy.splitwise.deadline import Deadline
from fastdeploy.splitwise.transport import PeerUnreachableError

# How long a caller waits for the I/O thread to run its call: far beyond one loop turn (one piece copied and hashed)
CALL_TIMEOUT_S = 10.0


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

    def call(self, what: str, fn: Callable, *args):
        """Run `fn(*args)` on the I/O thread and return its result (or raise its exception)."""
        if threading.current_thread() is self.owner:
            return fn(*args)
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"ZmqTransport.{what}: the transport is closed")
            self._calls.append((future, fn, args))
        self.wake()
        try:
            return future.result(timeout=CALL_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            if not future.cancel():   # it is running: its effect stands, so wait for its answer
                return future.result(timeout=CALL_TIMEOUT_S)
            raise PeerUnreachableError(f"ZmqTransport.{what}: the connector's I/O thread did not answer within "
                                       f"{CALL_TIMEOUT_S:g} s (nothing was done)") from None

    def post(self, fn: Callable, *args) -> None:
        """Run `fn(*args)` on the I/O thread later, without waiting (nothing to answer)."""
        with self._lock:
            if self._closed:
                return
            self._calls.append((concurrent.futures.Future(), fn, args))
        self.wake()

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
                future, fn, args = self._calls.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as error:   # noqa: BLE001 - handed to the caller, who raises it
                    future.set_exception(error)

    def close(self) -> None:
        """No more calls; those still queued fail (the thread has stopped)."""
        with self._lock:
            self._closed = True
            calls, self._calls = list(self._calls), collections.deque()
        for future, _, _ in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError("ZmqTransport: the transport closed before the call ran"))
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
