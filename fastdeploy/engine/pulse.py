"""Sends the engine core's heartbeat from a thread of its own, so that a long step is not silence (SERVICES §6).

The step loop marks each turn (`busy`); every `interval_s` the thread sends a `Heartbeat` naming how many turns the
loop has finished and how long the current one has run. The API server (engine/core_client.py) then tells the
three apart: a core that sends nothing is wedged as a whole (stopped, or a call that never gives the interpreter
back); a core whose heartbeat goes on while one turn runs long is busy, however long the turn, unless the operator
bounded a step (`--step-timeout-s`); a core whose process exited is dead.

The thread needs the interpreter for a moment every interval: the model's native calls release it, and one that
holds it longer than `--heartbeat-timeout-s` (none in this project comes near: the longest measured, in an 8k-token
prefill of fd-tiny, held it 0.5 s) would read as a wedged core.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from fastdeploy.schema.core_protocol import Heartbeat


class Pulse:
    """`send` must be safe to call from this thread while the loop sends too (engine_core serialises the two), and
    must not block for long (so that `stop` returns)."""

    def __init__(self, send: Callable[[Heartbeat], None], interval_s: float):
        self._send = send
        self.interval_s = interval_s
        self.turns = 0                         # step-loop turns finished
        self._busy_since: float | None = None  # monotonic start of the turn now running, None between turns
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fd-core-pulse", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    @contextlib.contextmanager
    def busy(self):
        """Around one turn of work (take in, step): its duration is what the heartbeat reports."""
        self._busy_since = time.monotonic()
        try:
            yield
        finally:
            self._busy_since = None
            self.turns += 1

    def beat(self) -> Heartbeat:
        since = self._busy_since
        return Heartbeat(turns=self.turns, busy_s=0.0 if since is None else time.monotonic() - since)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            self._send(self.beat())
