"""A connector's refusal log (fastdeploy/splitwise/refusals.py, SERVICES §7): every refusal is counted by reason,
and a flood of one reason costs one log line per LOG_EVERY_S, which says how many went unlogged since the last."""
from __future__ import annotations

import logging

import pytest

from fastdeploy.splitwise import refusals
from fastdeploy.splitwise.refusals import LOG_EVERY_S, RefusalLog

LOGGER = logging.getLogger("tests.refusals")


def test_a_flood_is_counted_whole_and_logged_once_a_second_per_reason(monkeypatch, caplog):
    now = [100.0]
    monkeypatch.setattr(refusals.time, "monotonic", lambda: now[0])
    caplog.set_level(logging.WARNING, logger=LOGGER.name)
    log = RefusalLog(("malformed", "stale"), LOGGER)
    for _ in range(5):
        log.refuse("malformed", "r1", "a frame")
    log.refuse("stale", "r2", "an ack")   # another reason has its own clock
    now[0] += LOG_EVERY_S
    log.refuse("malformed", "r3", "a frame")
    log.count("stale")                    # counted, logged by its caller
    assert log.counts() == {"malformed": 6, "stale": 2}
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3, lines
    assert "reason malformed" in lines[0] and "more refused" not in lines[0]
    assert "reason stale" in lines[1]
    assert "'r3', reason malformed; 4 more refused for this reason since the last report" in lines[2]


def test_an_undeclared_reason_is_an_error_not_a_new_count():
    with pytest.raises(KeyError):
        RefusalLog(("stale",), LOGGER).count("novel")
