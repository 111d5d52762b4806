"""Runs a hosts benchmark (benchmarks/handoff_hosts.py, pd_hosts_latency.py) as a user would, from the tree's root
with this tree first on PYTHONPATH, and checks that it left no namespace behind, also when it had to be killed."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.hosts import netns
from tests.services import launcher


def run_hosts_benchmark(script: str, *arguments: str, timeout: float) -> str:
    """The script's stdout once it exited 0 (skips the test where this machine cannot build hosts)."""
    if (reason := netns.unavailable_reason()) is not None:
        pytest.skip(f"cannot build hosts here: {reason}")
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(launcher.REPO), os.environ.get("PYTHONPATH")) if p))
    process = subprocess.Popen([sys.executable, script, *arguments], cwd=launcher.REPO, env=environment,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        left = netns.leftovers(f"fdh{process.pid}-")
        netns.sweep_orphans()   # removes what a benchmark killed before its teardown left
    assert process.returncode == 0, stderr[-3000:]
    assert not left, f"the benchmark left namespaces behind: {left}"
    return stdout
