"""MooncakeEngine.wait is bounded (docs/design.md §8): writes that do not land within the timeout are a
MooncakeError naming them, instead of blocking P's placing thread for as long as the transfer engine runs them; the
error says when the engine has let go of them (until then it may still read the source). The writes are watched by
asking the engine for each one's status with pauses between looks, never by the binding's batch wait, which spins
a core until the batch ends."""
from __future__ import annotations

import threading
import time

import pytest

from fastdeploy.splitwise.mooncake import MooncakeEngine, MooncakeError, WritesStillRunning


class _FakeEngine:
    """The binding's surface the wait uses: `transfer_check_status(write)` -> 0 running, 1 landed, -1 failed
    (a landed or failed write is freed: looking at it again is an error), as told by `codes`."""

    def __init__(self, codes: dict[int, int]):
        self.codes, self.looks = dict(codes), 0
        self.freed: set[int] = set()
        self.release = threading.Event()   # stuck writes (code 0) land once set

    def transfer_check_status(self, write: int) -> int:
        assert write not in self.freed, f"write {write} looked at after the engine freed it"
        self.looks += 1
        code = self.codes[write]
        if code == 0 and self.release.is_set():
            code = 1
        if code != 0:
            self.freed.add(write)
        return code

    def batch_transfer_async_write(self, *args):
        pytest.fail("the writes are started one batch each (transfer_submit_write)")

    def get_batch_transfer_status(self, *args):
        pytest.fail("the binding's batch wait spins a core: never called")


def _engine(transfer) -> MooncakeEngine:
    engine = object.__new__(MooncakeEngine)   # no transfer engine started: only the writes' surface is under test
    engine._engine = transfer
    return engine


def test_writes_that_do_not_land_in_time_are_an_error_that_says_when_the_engine_lets_go():
    fake = _FakeEngine({7: 1, 8: 0})
    try:
        with pytest.raises(WritesStillRunning, match="did not land within 0.2 s") as raised:
            _engine(fake).wait("127.0.0.1:1", (7, 8), timeout_s=0.2)
        assert not raised.value.ended.is_set()   # the engine still runs write 8: its source stays untouched
        looks = fake.looks
        time.sleep(0.3)
        # the watch pauses between looks (at most every 5 ms once it has backed off), it does not spin
        assert fake.looks - looks <= 0.3 / 0.005 + 2, fake.looks - looks
    finally:
        fake.release.set()
    assert raised.value.ended.wait(30)


def test_a_failed_write_while_others_run_keeps_the_source_until_they_end():
    fake = _FakeEngine({1: -1, 2: 0})
    with pytest.raises(WritesStillRunning, match=r"a write failed \(code -1\) while others still run") as raised:
        _engine(fake).wait("127.0.0.1:1", (1, 2), timeout_s=30)   # the failure is told at once, not at the timeout
    assert not raised.value.ended.is_set()
    fake.release.set()
    assert raised.value.ended.wait(30)


def test_an_engine_that_raises_is_an_error_with_nothing_left_running():
    class Broken:
        def transfer_check_status(self, write):
            raise RuntimeError("engine torn down")

    with pytest.raises(MooncakeError, match="a write to 127.0.0.1:1 failed .waiting failed: engine torn down") \
            as raised:
        _engine(Broken()).wait("127.0.0.1:1", (7,), timeout_s=5)
    assert not isinstance(raised.value, WritesStillRunning)


def test_writes_that_land_or_fail_are_reported():
    _engine(_FakeEngine({1: 1, 2: 1})).wait("127.0.0.1:1", (1,), (2,), timeout_s=5)
    with pytest.raises(MooncakeError, match=r"a write to 127.0.0.1:1 failed \(code -1") as raised:
        _engine(_FakeEngine({1: 1, 2: -1})).wait("127.0.0.1:1", (1, 2), timeout_s=5)
    assert not isinstance(raised.value, WritesStillRunning)


def test_a_write_that_cannot_start_after_others_did_waits_for_them():
    class Starting(_FakeEngine):
        def transfer_submit_write(self, session, source, destination, length):
            return 0 if source == 3 else source   # write 3 cannot start (0: the binding's "not started")

    fake = Starting({1: 0, 2: 0})
    with pytest.raises(WritesStillRunning, match="could not start") as raised:
        _engine(fake).submit_write("127.0.0.1:1", [1, 2, 3], [10, 20, 30], [4, 4, 4])
    assert not raised.value.ended.is_set()   # writes 1 and 2 run on
    fake.release.set()
    assert raised.value.ended.wait(30)
    with pytest.raises(MooncakeError, match="could not start") as raised:
        _engine(fake).submit_write("127.0.0.1:1", [3], [30], [4])
    assert not isinstance(raised.value, WritesStillRunning)
    assert _engine(fake).submit_write("127.0.0.1:1", [1, 2], [10, 20], [4, 4]) == (1, 2)
