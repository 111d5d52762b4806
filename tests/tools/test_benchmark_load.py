"""benchmarks/load.py, the load accounting of the benchmarks that print ratios (docs/benchmarks.md, "Load"): CPU
that another process takes during a run is counted elsewhere and marks the run loaded, the benchmark's own CPU
(this process, its threads, its children, the children it reaped, the deployment's processes) is not. The checks
compare CPU times the kernel reports, never wall-clock bounds."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.load import QUIET_SHARE, LoadMeter, LoadReading, process_cpu_s, ratio_text

TICKS = 0.05   # /proc counts CPU in clock ticks: allow a few of them either way
SPIN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"


def test_a_reading_is_loaded_above_the_quiet_share_and_its_ratio_is_marked():
    quiet = LoadReading(wall_s=10.0, machine_s=10.5, own_s=10.0, cores=2)
    loaded = LoadReading(wall_s=10.0, machine_s=12.0, own_s=10.0, cores=2)
    assert quiet.elsewhere_share == 0.025 and not quiet.loaded
    assert loaded.elsewhere_share == 0.1 > QUIET_SHARE and loaded.loaded
    assert ratio_text(1.234, quiet, quiet) == "1.23"
    assert ratio_text(1.234, quiet, loaded) == "(1.23) loaded"
    assert loaded.describe() == "10% elsewhere (loaded)"


def test_a_reaped_helper_process_is_the_benchmarks_own():
    helper = subprocess.Popen([sys.executable, "-c", SPIN])
    meter = LoadMeter()
    meter.start()
    helper.wait(60)
    assert meter.stop().own_s >= 0.6 - TICKS


def test_another_process_is_counted_elsewhere_and_a_deployment_process_as_own():
    for deployment in (False, True):
        # the spinner is started by a go-between that exits at once, so it is not a descendant of this process
        # (this process's children are the benchmark's own); it spins, then blocks until its stdin closes
        starter = subprocess.Popen(
            [sys.executable, "-c", "import subprocess, sys\n"
             f"print(subprocess.Popen([sys.executable, '-c', {SPIN + 'import sys; sys.stdin.read()'!r}]).pid)"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        spinner_pid = int(starter.stdout.readline())
        starter.wait(60)
        try:
            meter = LoadMeter([spinner_pid] if deployment else [])
            meter.start()
            before = process_cpu_s(spinner_pid)
            spent = _wait_for_cpu(spinner_pid, 0.6) - before
            reading = meter.stop()
            if deployment:
                assert reading.own_s >= spent - TICKS, reading
            else:
                assert reading.elsewhere_s >= spent - TICKS, reading
        finally:
            starter.stdin.close()   # the spinner's stdin: it reads end-of-file and exits
            _wait_gone(spinner_pid)


def test_this_processs_threads_are_its_own():
    meter = LoadMeter()
    meter.start()
    thread = threading.Thread(target=exec, args=(SPIN,))
    thread.start()
    thread.join(60)
    reading = meter.stop()
    assert reading.own_s >= 0.6 - TICKS, reading


def _wait_for_cpu(pid: int, seconds: float) -> float:
    """Waits until process `pid` has spent `seconds` of CPU since it started (it spins that long, then blocks);
    returns what it spent."""
    while (spent := process_cpu_s(pid)) < seconds - TICKS:
        time.sleep(0.05)
    return spent


def _wait_gone(pid: int) -> None:
    """Waits until process `pid` (not a child of this one, so not waitable) has exited: gone, or a zombie its
    new parent has yet to reap."""
    for _ in range(1200):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except OSError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def test_serving_keeps_the_fastest_quiet_repeat_and_judges_no_target_on_a_loaded_one():
    from benchmarks.serving import Level, _judged, best_run

    quiet, loaded = LoadReading(10.0, 10.2, 10.0, 2), LoadReading(10.0, 15.0, 10.0, 2)
    slow_quiet = Level(wall_s=2.0, tokens=100, load=quiet)
    fast_loaded = Level(wall_s=1.0, tokens=100, load=loaded)
    assert best_run([fast_loaded, slow_quiet]) is slow_quiet
    assert best_run([fast_loaded]) is fast_loaded
    assert _judged(1.2, ">=", 1.0, slow_quiet, slow_quiet) == "(>= 1.0: met)"
    assert _judged(0.8, ">=", 1.0, slow_quiet, slow_quiet) == "(>= 1.0: NOT met)"
    assert _judged(1.2, ">=", 1.0, slow_quiet, fast_loaded) == "(>= 1.0: not judged, taken under load)"
