"""benchmarks/pd_hosts_latency.py in smoke mode: PD on one host and across three hosts (router, P, D), C = 2
streams of 8 tokens each, over the zmq connector; it completes, prints one table row per transport with the load
column, and leaves no namespace behind (no figure is asserted). One transport: the script's transport is a flag its
deployments pass on, and Mooncake across hosts is served by tests/hosts/test_pd_across_hosts.py's tests."""
from __future__ import annotations

from tests.hosts.benchmark_run import run_hosts_benchmark


def test_pd_hosts_latency_benchmark_runs_in_smoke_mode():
    transports = ["zmq"]
    stdout = run_hosts_benchmark("benchmarks/pd_hosts_latency.py", "--smoke", "--transports", *transports,
                                 timeout=600)
    assert "| transport | C | requests | TTFT p50 ms (1 host / hosts)" in stdout, stdout
    rows = [line for line in stdout.splitlines() if line.startswith("| ") and "transport" not in line]
    assert [row.split("|")[1].strip() for row in rows] == transports, stdout
    for row in rows:
        assert row.rstrip(" |").split("|")[-1].strip().count("%") == 2, row   # the load of both runs
    assert "elsewhere:" in stdout
