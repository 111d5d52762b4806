"""The floods of the flood battery (tests/services/test_flood.py) and of benchmarks/pd_flood_ttft.py, against a
running router + P + D (tests/services/deployment.py): each starts flooding processes (tests/splitwise/flooder.py)
or requests, and `Flood.stop` ends them. Also what the battery measures: an engine core's resident memory, and
the refusals an instance counted (the proof that a flood reached the connector's parser)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.services import launcher
from tests.services.deployment import Deployment, registered

SILENT = "127.0.0.1:9"   # the discard port: nothing answers a reservation there


def flood_slowdown() -> float:
    """launcher.load_slowdown: the battery's deadlines scale with it."""
    return launcher.load_slowdown()


def mem_available() -> str:
    """The machine's MemAvailable, for a failure report (an engine core killed with -9 may be the OOM killer's)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return f"MemAvailable {int(line.split()[1]) // 1024} MiB"
    return "MemAvailable unknown"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def refused(server: launcher.Server, reason: str | None = None) -> float:
    """Connector messages the instance refused (by `reason`, or all), from its metrics."""
    prefix = "fastdeploy:pd_messages_refused_total"
    return sum(v for k, v in server.metrics().items()
               if k.startswith(prefix) and (reason is None or f"reason={reason}" in k))


def pd_secret(server: launcher.Server) -> str | None:
    """The PD secret an instance was started with (`--pd-secret-file`), None without one."""
    flags = server.flags
    if "--pd-secret-file" not in flags:
        return None
    return Path(flags[flags.index("--pd-secret-file") + 1]).read_text().strip()


def connector_addr(deployment: Deployment, role: str) -> str:
    rows = {row["role"]: row for row in registered(deployment.router).values()}
    return rows[role]["connector_addr"]


@dataclass
class Flood:
    processes: list[subprocess.Popen] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)   # the first line each flooder printed

    def flooder(self, *args: str, read_line: bool = False, secret: str | None = None) -> subprocess.Popen:
        """With `secret` the flooder holds its transport keys (a stranger delivers no frame at all, SERVICES §7),
        so that its junk reaches the connector's parser; its tags stay unkeyed."""
        env = {name: value for name, value in os.environ.items() if name != "FD_PD_SECRET"}
        if secret is not None:
            env["FD_PD_SECRET"] = secret
        process = subprocess.Popen([sys.executable, "-m", "tests.splitwise.flooder", *args], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, cwd=launcher.REPO, env=env)
        self.processes.append(process)
        if read_line:
            self.lines.append(process.stdout.readline().strip())
        return process

    def requests_to_d(self, decode: launcher.Server, prefill_addr: str, count: int, prefix: str) -> None:
        """`count` concurrent requests straight to D, paired with the P at `prefill_addr` (a lure or a silent
        address): each fails at its own deadline; their answers are not looked at."""
        def one(i: int) -> None:
            body = {"model": "fd-toy", "prompt": "x", "max_tokens": 2,
                    "disaggregate_info": {"request_id": f"{prefix}-{i}", "prefill_addr": prefill_addr}}
            try:
                httpx.post(decode.url + "/v1/completions", json=body, timeout=120)
            except httpx.HTTPError:
                pass

        for i in range(count):
            thread = threading.Thread(target=one, args=(i,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def junk_at_p(self, deployment: Deployment) -> None:
        self.flooder("junk", connector_addr(deployment, "prefill"), secret=pd_secret(deployment.instances["prefill"]))

    def junk_at_d(self, deployment: Deployment) -> None:
        """A "P" that floods the D that reserves at it, and a request to D naming it."""
        self.flooder("fake-p", "junk", read_line=True, secret=pd_secret(deployment.instances["decode"]))
        self.requests_to_d(deployment.instances["decode"], self.lines[-1], 1, f"lure-{time.monotonic_ns()}")

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait(timeout=10)
        self.processes.clear()

    def join(self, timeout_s: float = 120.0) -> None:
        for thread in self.threads:
            thread.join(timeout_s)
        self.threads.clear()
