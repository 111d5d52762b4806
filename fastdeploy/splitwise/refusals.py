"""How a connector accounts for the peer messages it refuses (SERVICES §7): a count per reason, read by any thread
(the `pd_messages_refused_total` metric), and a log line per reason at most every `LOG_EVERY_S`, so that a flood
costs one line a second per reason, which says how many went unlogged since the last."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

LOG_EVERY_S = 1.0


class RefusalLog:
    """`refuse` is called by one thread (the connector's I/O thread, which keeps the log's clock); the counts are
    read and written under a lock, from any thread."""

    def __init__(self, reasons: Iterable[str], logger: logging.Logger):
        self._logger = logger
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(reasons, 0)
        self._log_times: dict[str, tuple[float, int]] = {}   # reason -> (last logged, not logged since)

    def refuse(self, reason: str, request_id: str | None, what: str) -> None:
        """Count a refused message (`what` describes it) and log it, unless a refusal for the same reason was
        logged less than `LOG_EVERY_S` ago."""
        self.count(reason)
        now = time.monotonic()
        last, unlogged = self._log_times.get(reason, (-LOG_EVERY_S, 0))
        if now - last < LOG_EVERY_S:
            self._log_times[reason] = (last, unlogged + 1)
            return
        self._log_times[reason] = (now, 0)
        more = f"; {unlogged} more refused for this reason since the last report" if unlogged else ""
        self._logger.warning("PD connector: refused %s (request %.80r, reason %s%s)", what, request_id, reason, more)

    def count(self, reason: str) -> None:
        """Count a refusal that is logged elsewhere (KeyError for a reason not declared)."""
        with self._lock:
            self._counts[reason] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
