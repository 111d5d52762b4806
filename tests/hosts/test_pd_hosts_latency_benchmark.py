"""benchmarks/pd_hosts_latency.py in smoke mode: PD on one host and across three hosts (router, P, D), C = 2
streams of 8 tokens each, over the zmq connector (and Mooncake TCP where it loads); it completes, prints one table
row per transport with the load column, and leaves no namespace behind (no figure is asserted)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from tests.hosts import netns
from tests.services import launcher


def test_pd_hosts_latency_benchmark_runs_in_smoke_mode():
    if (reason := netns.unavailable_reason()) is not None:
        pytest.skip(f"cannot build hosts here: {reason}")
    transports = ["zmq"] + ([] if mooncake_unavailable_reason() else ["mooncake-tcp"])
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(launcher.REPO), os.environ.get("PYTHONPATH")) if p))
    process = subprocess.Popen([sys.executable, "benchmarks/pd_hosts_latency.py", "--smoke", "--transports",
                                *transports], cwd=launcher.REPO, env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        left = netns.leftovers(f"fdh{process.pid}-")
        netns.sweep_orphans()   # removes what a benchmark killed before its teardown left
    assert process.returncode == 0, stderr[-3000:]
    assert "| transport | C | requests | TTFT p50 ms (1 host / hosts)" in stdout, stdout
    rows = [line for line in stdout.splitlines() if line.startswith("| ") and "transport" not in line]
    assert [row.split("|")[1].strip() for row in rows] == transports, stdout
    for row in rows:
        assert row.rstrip(" |").split("|")[-1].strip().count("%") == 2, row   # the load of both runs
    assert "elsewhere:" in stdout
    assert not left, f"the benchmark left namespaces behind: {left}"
