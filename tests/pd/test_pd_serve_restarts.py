"""`fastdeploy serve --pd`'s restart rule (fastdeploy/entrypoints/pd_serve.py, docs/serving.md "Supervision"): a
child that exits is restarted after a backoff that doubles (1, 2, 4, 8, 16 s), at most MAX_RESTARTS times in a
row; past that the supervisor gives up; a child that ran STABLE_AFTER_S counts as healthy again. Driven with the
supervisor's own clock argument, read from time.monotonic() as the supervisor's loop does (never from the child's
bookkeeping, which would hide a start time that is not recorded), over a real child process that exits at once."""
from __future__ import annotations

import os
import sys
import time

import pytest

from fastdeploy.entrypoints import pd_serve


def failing_child() -> pd_serve._Child:
    child = pd_serve._Child("decode instance", [sys.executable, "-c", "raise SystemExit(3)"], 0, dict(os.environ))
    child.start()
    child.popen.wait(60)
    return child


def exit_and_restart(child: pd_serve._Child, now: float) -> float:
    """Lets the child's exit be noticed at `now`, then restarts it when its backoff is over; returns the backoff."""
    pd_serve._supervise_once(child, now)
    delay = child.restart_at - now
    pd_serve._supervise_once(child, now + delay / 2)      # not yet
    assert child.restart_at is not None
    pd_serve._supervise_once(child, now + delay)
    assert child.restart_at is None
    child.popen.wait(60)
    return delay


def test_backoff_doubles_and_the_supervisor_gives_up_after_max_restarts(capsys):
    child = failing_child()
    delays = [exit_and_restart(child, time.monotonic()) for _ in range(pd_serve.MAX_RESTARTS)]
    assert delays == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0])   # restart_at - now on the monotonic clock
    with pytest.raises(RuntimeError, match="after 5 restarts in a row"):
        pd_serve._supervise_once(child, time.monotonic())
    log = capsys.readouterr().err
    assert log.count("decode instance exited with status 3; restarting in") == pd_serve.MAX_RESTARTS
    assert "decode instance restarted (pid" in log


def test_a_child_that_ran_long_enough_starts_counting_again():
    child = failing_child()
    for _ in range(pd_serve.MAX_RESTARTS - 1):
        exit_and_restart(child, time.monotonic())
    assert exit_and_restart(child, time.monotonic() + pd_serve.STABLE_AFTER_S) == pytest.approx(pd_serve.BACKOFF_S)
    assert child.failures_in_a_row == 1
