"""benchmarks/handoff_hosts.py in smoke mode: P and D on two hosts, a 1 MiB hand-off over a 1 Gbit/s tbf link
without and with the relay's delay, over the zmq connector with and without a secret (and Mooncake TCP where it
loads); it prints a row per
case with its share of the link and the load column, and leaves no namespace behind (no figure is asserted)."""
from __future__ import annotations

from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from tests.hosts.benchmark_run import run_hosts_benchmark


def test_handoff_hosts_benchmark_runs_in_smoke_mode():
    paths = ["zmq", "zmq-no-secret"] + ([] if mooncake_unavailable_reason() else ["mooncake"])
    stdout = run_hosts_benchmark("benchmarks/handoff_hosts.py", "--quick", "--rates", "1gbit", "--sizes-mib", "1",
                                 "--delay-ms", "0", "5", "--paths", *paths, timeout=300)
    rows = [line for line in stdout.splitlines() if line.startswith("| ") and "MiB |" in line]
    assert len(rows) == 2 * len(paths), stdout
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1] == "1gbit" and cells[3] == "1 MiB" and float(cells[4]) > 0, row
        assert cells[5].split()[0].strip("()").replace(".", "", 1).isdigit() and cells[6].rstrip("!").endswith("%")
    assert {row.split("|")[3].strip() for row in rows} == {"0 ms", "5 ms"}
    assert {row.split("|")[1].strip() for row in rows} >= {"zmq connector + secret", "zmq connector"}
    assert "elsewhere: up to" in stdout
