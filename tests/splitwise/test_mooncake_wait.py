"""MooncakeEngine.wait is bounded (docs/design.md §8): a write batch that does not land within its timeout is a
MooncakeError naming it, instead of blocking P's scheduler thread for as long as the transfer engine waits."""
from __future__ import annotations

import threading

import pytest

from fastdeploy.splitwise.mooncake import MooncakeEngine, MooncakeError


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


def test_a_write_that_does_not_land_in_time_is_an_error():
    stuck = _StuckEngine()
    try:
        with pytest.raises(MooncakeError, match="did not land within 0.2 s"):
            _engine(stuck).wait("127.0.0.1:1", 7, timeout_s=0.2)
    finally:
        stuck.release.set()


def test_a_write_that_lands_or_fails_is_reported():
    class Done:
        def __init__(self, code):
            self.code = code

        def get_batch_transfer_status(self, batches):
            return self.code

    _engine(Done(0)).wait("127.0.0.1:1", 7, timeout_s=5)
    with pytest.raises(MooncakeError, match="failed"):
        _engine(Done(-1)).wait("127.0.0.1:1", 7, timeout_s=5)
