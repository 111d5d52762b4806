"""Process helpers for the router tests: start the real router and fake instances on 127.0.0.1, wait for a
condition with a bound, and stop every process (SIGTERM, then SIGKILL) whatever the test's outcome."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_instance.py")
# Generous bounds for a loaded 2-core machine: they only turn a hang into a failure, never time a result.
START_TIMEOUT_S = 60.0
WAIT_TIMEOUT_S = 30.0
INTERVAL_S = 0.25


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition, what: str, timeout: float = WAIT_TIMEOUT_S, period: float = 0.05):
    """Polls ``condition()`` until it returns a truthy value, which is returned; fails after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(period)


class Proc:
    """A child process with its output in a temporary file (a pipe could fill up and block it)."""

    def __init__(self, argv: list[str], port: int):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._log = tempfile.TemporaryFile()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def wait_ready(self, path: str = "/health") -> None:
        def ready():
            if self.popen.poll() is not None:
                raise AssertionError(f"process exited with {self.popen.returncode}:\n{self.output()}")
            return httpx.get(self.url + path, timeout=2.0).status_code < 500
        wait_until(ready, f"{self.url}{path}", timeout=START_TIMEOUT_S)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stops the process and returns its exit status (SIGKILL after a bounded wait)."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=15)
        self._log.close()
        return self.popen.returncode


def start_router(*flags: str, port: int | None = None) -> Proc:
    port = port or free_port()
    proc = Proc([sys.executable, "-m", "fastdeploy.router.launch", "--host", "127.0.0.1", "--port", str(port),
                 "--health-interval-secs", str(INTERVAL_S), *flags], port)
    return proc


def start_fake(router: Proc, role: str = "mixed", config_hash: str = "hash-a", model: str = "fd-toy") -> Proc:
    port = free_port()
    argv = [sys.executable, str(FAKE), "--port", str(port), "--router", f"127.0.0.1:{router.port}",
            "--role", role, "--config-hash", config_hash, "--model", model, "--interval", str(INTERVAL_S)]
    if role != "mixed":
        argv += ["--connector-port", str(free_port())]
    return Proc(argv, port)


def registered(router: Proc) -> dict[int, dict]:
    """The router's ``/registered`` rows by instance port."""
    rows = httpx.get(router.url + "/registered", timeout=5.0).json()["instances"]
    return {row["port"]: row for row in rows}


def control(fake: Proc, **settings) -> None:
    httpx.post(fake.url + "/control", json=settings, timeout=5.0).raise_for_status()


def events(fake: Proc) -> list[dict]:
    return httpx.get(fake.url + "/events", timeout=5.0).json()


class Deployment:
    """A router and its fake instances, started together and stopped together."""

    def __init__(self, router_flags: tuple[str, ...], roles: list[tuple[str, str]]):
        self.router = start_router(*router_flags)
        self.fakes = [start_fake(self.router, role, config_hash) for role, config_hash in roles]
        try:
            self.router.wait_ready()
            for fake in self.fakes:
                fake.wait_ready()
            wait_until(lambda: len(registered(self.router)) == len(self.fakes), "all instances registered")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> int:
        """Stops everything; returns the router's exit status."""
        for fake in self.fakes:
            fake.stop()
        return self.router.stop()
