"""benchmarks/handoff_hosts.py in smoke mode: P and D on two hosts, a 1 MiB hand-off over a 1 Gbit/s tbf link
without and with the relay's delay, over the zmq connector (and Mooncake TCP where it loads); it prints a row per
case with its share of the link and the load column, and leaves no namespace behind (no figure is asserted)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from tests.hosts import netns
from tests.services import launcher


def test_handoff_hosts_benchmark_runs_in_smoke_mode():
    if (reason := netns.unavailable_reason()) is not None:
        pytest.skip(f"cannot build hosts here: {reason}")
    paths = ["zmq"] + ([] if mooncake_unavailable_reason() else ["mooncake"])
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(launcher.REPO), os.environ.get("PYTHONPATH")) if p))
    process = subprocess.Popen([sys.executable, "benchmarks/handoff_hosts.py", "--quick", "--rates", "1gbit",
                                "--sizes-mib", "1", "--delay-ms", "0", "5", "--paths", *paths],
                               cwd=launcher.REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        left = netns.leftovers(f"fdh{process.pid}-")
        netns.sweep_orphans()   # removes what a benchmark killed before its teardown left
    assert process.returncode == 0, stderr[-3000:]
    rows = [line for line in stdout.splitlines() if line.startswith("| ") and "MiB |" in line]
    assert len(rows) == 2 * len(paths), stdout
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1] == "1gbit" and cells[3] == "1 MiB" and float(cells[4]) > 0, row
        assert cells[5].split()[0].strip("()").replace(".", "", 1).isdigit() and cells[6].rstrip("!").endswith("%")
    assert {row.split("|")[3].strip() for row in rows} == {"0 ms", "5 ms"}
    assert "elsewhere: up to" in stdout
    assert not left, f"the benchmark left namespaces behind: {left}"
