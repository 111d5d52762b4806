"""How much of the machine went to other processes while a benchmark ran (docs/benchmarks.md, "Load").

A ratio between two deployments is a result only if both ran on an otherwise idle machine: other load takes cores
from a deployment in proportion to how many processes it runs, so it shifts ratios between a 2-process and a
5-process deployment by far more than the effects measured. `LoadMeter` reads, from /proc, the machine's busy CPU
time (every core: /proc/stat's user, nice, system, irq, softirq, steal) and the CPU time of the benchmark's own
processes (this process with its threads, its children and the children it reaped, and the given pids with their descendants:
/proc/<pid>/stat utime + stime) at the start and the end of a run; what the machine spent beyond its own processes went elsewhere, as a
share of the machine's capacity over the run (wall time x online cores). A run with more than `QUIET_SHARE`
elsewhere is loaded: its absolute figures are still printed, its ratios are marked and never judged against a
target.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

# Above this share of the machine's CPU spent by other processes during a run, the run is "loaded".
QUIET_SHARE = 0.05
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)   # /proc/stat "cpu": user nice system [idle iowait] irq softirq steal


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy since boot (guest time is inside user)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields)) * _TICK_S


def process_cpu_s(pid: int, reaped_children: bool = False) -> float:
    """utime + stime of a process (all its threads), 0 once it is gone; with `reaped_children`, plus the CPU of
    its children that ended and were waited for (cutime + cstime)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped_children else 0)
    return ticks * _TICK_S


def with_descendants(pids: list[int]) -> list[int]:
    """`pids` and every process below them (each thread's children, as /proc lists them)."""
    seen, pending = [], list(pids)
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.append(pid)
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                pending += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                pass
    return seen


@dataclass(frozen=True, slots=True)
class LoadReading:
    """One run: wall seconds, the machine's busy CPU seconds, those of the benchmark's own processes, and the
    share of the machine's capacity (wall x cores) that went to other processes."""

    wall_s: float
    machine_s: float
    own_s: float
    cores: int

    @property
    def elsewhere_s(self) -> float:
        return max(self.machine_s - self.own_s, 0.0)

    @property
    def elsewhere_share(self) -> float:
        capacity = self.wall_s * self.cores
        return self.elsewhere_s / capacity if capacity > 0 else 0.0

    @property
    def loaded(self) -> bool:
        return self.elsewhere_share > QUIET_SHARE

    def describe(self) -> str:
        """"3% elsewhere" or "41% elsewhere (loaded)"."""
        return f"{self.elsewhere_share:.0%} elsewhere{' (loaded)' if self.loaded else ''}"


class LoadMeter:
    """Measures one run: `start()` before it, `stop()` after it. `pids`: the deployment's processes (their
    descendants are found at each reading); this process is always counted as the benchmark's own."""

    def __init__(self, pids: list[int] = ()):
        self._pids = [os.getpid(), *pids]
        self._start: tuple[float, float, dict[int, float]] | None = None

    def _own(self) -> dict[int, float]:
        # this process with the children it started and reaped during the run (a benchmark's helper processes)
        return {pid: process_cpu_s(pid, reaped_children=pid == self._pids[0]) for pid in with_descendants(self._pids)}

    def start(self) -> None:
        self._start = (time.perf_counter(), machine_busy_s(), self._own())

    def stop(self) -> LoadReading:
        started, machine, own = self._start
        now, busy, later = time.perf_counter(), machine_busy_s(), self._own()
        # a process born during the run counts from 0; one that ended took its time with it (counted elsewhere)
        own_s = sum(cpu - own.get(pid, 0.0) for pid, cpu in later.items())
        return LoadReading(now - started, busy - machine, own_s, os.cpu_count() or 1)


def quiet(*readings: LoadReading | None) -> bool:
    """Every reading (those given) was taken on a quiet machine."""
    return all(r is None or not r.loaded for r in readings)


def ratio_text(value: float, *readings: LoadReading | None) -> str:
    """A ratio as a table prints it: "1.13", or "(1.13) loaded" when one of its runs was loaded (not a result)."""
    return f"{value:.2f}" if quiet(*readings) else f"({value:.2f}) loaded"


def load_line(reading: LoadReading) -> str:
    """The line a benchmark prints under its table: how much of the machine went elsewhere, and what that means."""
    line = f"elsewhere: {reading.elsewhere_share:.0%} of the machine during the measurement (benchmarks/load.py)"
    return line + (" (loaded: the ratios above are not results; re-run on a quiet machine)" if reading.loaded else "")
