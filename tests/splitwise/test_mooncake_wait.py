"""MooncakeEngine.wait is bounded (docs/design.md §8): a write batch that does not land within its timeout is a
MooncakeError naming it, instead of blocking P's scheduler thread for as long as the transfer engine waits; the
error says when the engine has let go of the batch (until then it may still read the source)."""
from __future__ import annotations

import threading

import pytest

from fastdeploy.splitwise.mooncake import MooncakeEngine, MooncakeError, WritesStillRunning


class _StuckEngine:
    """A transfer engine whose batch never completes until released (the real one's wait has no bound)."""

    def __init__(self):
        self.release = threading.Event()

    def get_batch_transfer_status(self, batches):
        self.release.wait(30)
        return 0


def _engine(transfer) -> MooncakeEngine:
    engine = object.__new__(MooncakeEngine)   # no transfer engine started: only `wait` is under test
    engine._engine = transfer
    return engine


def test_a_write_that_does_not_land_in_time_is_an_error_that_says_when_the_engine_lets_go():
    stuck = _StuckEngine()
    try:
        with pytest.raises(WritesStillRunning, match="did not land within 0.2 s") as raised:
            _engine(stuck).wait("127.0.0.1:1", 7, timeout_s=0.2)
        assert not raised.value.ended.is_set()   # the engine still runs the batch: its source stays untouched
    finally:
        stuck.release.set()
    assert raised.value.ended.wait(30)


def test_an_engine_wait_that_raises_is_an_error_with_nothing_left_running():
    class Broken:
        def get_batch_transfer_status(self, batches):
            raise RuntimeError("engine torn down")

    with pytest.raises(MooncakeError, match="waiting for the writes to 127.0.0.1:1 failed") as raised:
        _engine(Broken()).wait("127.0.0.1:1", 7, timeout_s=5)
    assert not isinstance(raised.value, WritesStillRunning)


def test_a_write_that_lands_or_fails_is_reported():
    class Done:
        def __init__(self, code):
            self.code = code

        def get_batch_transfer_status(self, batches):
            return self.code

    _engine(Done(0)).wait("127.0.0.1:1", 7, timeout_s=5)
    with pytest.raises(MooncakeError, match="failed"):
        _engine(Done(-1)).wait("127.0.0.1:1", 7, timeout_s=5)
