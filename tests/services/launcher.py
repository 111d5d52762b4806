"""Starts and stops serving processes for the services tests: free port, wait for /health, SIGTERM then SIGKILL on
teardown, the process log kept for failure reports, and /metrics read back as numbers.

Every process is started in its own session so teardown can reach the engine core even when the API server was
killed; `stop` leaves no process behind. Logs go to `LOG_DIR`, which tests/services/conftest.py points at a pytest
temporary directory (pytest keeps the last few runs' directories and removes older ones), never to /tmp itself.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
API_SERVER = "fastdeploy.entrypoints.openai.api_server"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
LOG_DIR: Path | None = None   # set per session by tests/services/conftest.py


def load_slowdown() -> float:
    """How much slower than an idle machine this one runs now, 1 to 4: the 1-minute load average per CPU. Deadlines
    that a good request must meet, and the router's health interval, scale with it: the suite runs where other work
    loads the two cores too, and a deadline only says when to give up, so a longer one costs nothing on an idle
    machine (docs/testing.md "Under load")."""
    return min(4.0, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))


def log_file(prefix: str, directory: Path | None = None) -> Path:
    """A fresh log file under `directory`, else LOG_DIR (a pytest temporary directory); outside pytest
    (benchmarks/serving.py) under a directory of this process that is removed when it exits."""
    global LOG_DIR
    if directory is not None:
        return Path(tempfile.mkstemp(prefix=prefix, suffix=".log", dir=directory)[1])
    if LOG_DIR is None:
        LOG_DIR = Path(tempfile.mkdtemp(prefix="fd-services-logs-"))
        atexit.register(shutil.rmtree, LOG_DIR, ignore_errors=True)
    return Path(tempfile.mkstemp(prefix=prefix, suffix=".log", dir=LOG_DIR)[1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    log_path: Path
    flags: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def engine_core_pid(self) -> int:
        """The engine core's pid: the API server's child process, else its lifecycle log line."""
        with contextlib.suppress(OSError):
            pid = self.process.pid
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children:
                return int(children[0])
        match = re.search(r"engine core started \(pid (\d+)\)", self.log())
        if match is None:
            raise RuntimeError(f"no engine core pid (no child, no log line):\n{self.log()[-2000:]}")
        return int(match.group(1))

    def health(self) -> int:
        return httpx.get(f"{self.url}/health", timeout=5).status_code

    def metrics(self) -> dict[str, float]:
        """`/metrics` as {name or name{labels}: value} (prometheus-client's parser)."""
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return values

    def wait_until(self, predicate, what: str, timeout_s: float = 30.0, server_alive: bool = True) -> None:
        """Poll `predicate(self)` until true; a bounded wait, not a timing assertion. With server_alive (the
        default) the wait also fails as soon as the server process has exited."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self):
            exited = server_alive and self.process.poll() is not None
            if exited or time.monotonic() > deadline:
                why = "the server exited" if exited else f"not reached within {timeout_s} s"
                raise AssertionError(f"{what}: {why}\n{self.log()[-3000:]}")
            time.sleep(0.05)


def start(*flags: str, model: str | None = "fd-toy", wait_ready: bool = True, env: dict | None = None,
          module: str = API_SERVER, subcommand: str | None = None, port: int | None = None,
          log_dir: Path | None = None) -> Server:
    """`python -m MODULE [SUBCOMMAND] [--model MODEL] --host 127.0.0.1 --port <free> FLAGS` (MODULE: the API server
    by default; `fastdeploy serve` is module="fastdeploy.entrypoints.cli", subcommand="serve"; the router's launcher
    works the same, with model=None). The log goes to `log_dir` (a pytest tmp_path) when given."""
    port = free_port() if port is None else port
    log_path = log_file("fd-api-", log_dir)
    argv = [sys.executable, "-m", module, *((subcommand,) if subcommand else ()),
            *(("--model", model) if model else ()), "--host", "127.0.0.1", "--port", str(port), *flags]
    environment = dict(os.environ, **(env or {}))
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), environment.get("PYTHONPATH")) if p)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=environment,
                                   start_new_session=True)
    server = Server(process, port, log_path, list(flags))
    if wait_ready:
        await_ready(server)
    return server


def await_ready(server: Server, path: str = "/health") -> None:
    """Wait for `path` to answer 200 (a server started with wait_ready=False, e.g. while the test computes its
    oracle). A router's /health is 503 until it can serve, so it is awaited on /registered."""
    try:
        server.wait_until(lambda s: _answers_200(s, path), f"server ready ({path} 200)", START_TIMEOUT_S)
    except BaseException:
        stop(server)
        raise


def _answers_200(server: Server, path: str) -> bool:
    try:
        return httpx.get(server.url + path, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def stop(server: Server, sig: int = signal.SIGTERM) -> int | None:
    """Signal the API server, wait for it, then SIGKILL whatever is left of its session; returns its exit status
    (None if it had to be killed)."""
    core_pid = None
    with contextlib.suppress(RuntimeError):
        core_pid = server.engine_core_pid()
    status = None
    if server.process.poll() is None:
        server.process.send_signal(sig)
    try:
        status = server.process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(STOP_TIMEOUT_S)
    if core_pid is not None and is_alive(core_pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(core_pid, signal.SIGKILL)
    return status


def is_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


@contextlib.contextmanager
def serving(*flags: str, model: str = "fd-toy", wait_ready: bool = True, log_dir: Path | None = None):
    """A server for the block's duration (ready unless wait_ready=False), stopped and its log printed at the
    end."""
    server = start(*flags, model=model, wait_ready=wait_ready, log_dir=log_dir)
    try:
        yield server
    finally:
        stop(server)
        # pytest shows captured output only for failing tests, so this is the failure report
        print(f"---- server log ({model} {' '.join(server.flags)}) ----\n{server.log()[-6000:]}")
        server.log_path.unlink(missing_ok=True)


def nothing_held(server: Server) -> bool:
    """SERVICES §8 "nothing held": no request running or waiting, no block held for a hand-off, no write in
    flight from P's staging pool (Mooncake), and then every slot and KV block free. False while requests are still
    in flight; once none is, a slot or block still counted as taken is an AssertionError at once, so that a wrong
    gauge (or a leak) fails the test in one poll instead of at the end of a bounded wait."""
    m = server.metrics()
    busy = (m.get("fastdeploy:num_requests_running"), m.get("fastdeploy:num_requests_waiting"),
            m.get("fastdeploy:pd_held_kv_blocks", 0), m.get("fastdeploy:pd_staged_writes", 0))
    if busy != (0, 0, 0, 0):
        return False
    free = (m.get("fastdeploy:free_kv_blocks"), m.get("fastdeploy:free_slots"))
    total = (m.get("fastdeploy:total_kv_blocks"), m.get("fastdeploy:total_slots"))
    assert free == total and all(t and t > 0 for t in total), (
        f"no request in flight on {server.url}, yet (free KV blocks, free slots) = {free} of {total}")
    return True
