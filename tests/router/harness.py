"""Process helpers for the router tests: start the real router and fake instances on 127.0.0.1, wait for a
condition with a bound, and stop every process (SIGTERM, then SIGKILL) whatever the test's outcome."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.services.launcher import free_port

REPO = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_instance.py")
# Generous bounds for a loaded 2-core machine: they only turn a hang into a failure, never time a result.
START_TIMEOUT_S = 60.0
WAIT_TIMEOUT_S = 30.0
INTERVAL_S = 0.25
SECRET_ENV = ("FD_ROUTER_SECRET", "FD_PD_SECRET", "FD_API_KEY")


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

    def __init__(self, argv: list[str], port: int, ready_path: str = "/health", env: dict | None = None):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.ready_path = ready_path
        self._log = tempfile.TemporaryFile()
        # The fakes do not sign their heartbeats: a registration secret reaches a router only when a test asks.
        env = {**{k: v for k, v in os.environ.items() if k not in SECRET_ENV}, "PYTHONPATH": str(REPO),
               **(env or {})}
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def wait_ready(self, url: str | None = None) -> None:
        """Waits until ``url`` (default: this process's ready path) answers, failing if the process exits."""
        url = url or self.url + self.ready_path

        def ready():
            if self.popen.poll() is not None:
                raise AssertionError(f"process exited with {self.popen.returncode}:\n{self.output()}")
            return httpx.get(url, timeout=2.0).status_code < 500
        wait_until(ready, url, timeout=START_TIMEOUT_S)

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


def start_router(*flags: str, port: int | None = None, env: dict | None = None) -> Proc:
    port = port or free_port()
    proc = Proc([sys.executable, "-m", "fastdeploy.router.launch", "--host", "127.0.0.1", "--port", str(port),
                 "--health-interval-secs", str(INTERVAL_S), *flags], port, env=env,
                # the router's /health is 503 until it can serve a request; /registered answers once it listens
                ready_path="/registered")
    return proc


@dataclass(frozen=True)
class Fake:
    """One fake instance (of a FakeGroup process)."""

    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class FakeGroup:
    """Fake instances served by one process (one interpreter start), heartbeating to ``router_port``."""

    def __init__(self, router_port: int, roles: list[tuple[str, str]], model: str = "fd-toy"):
        self.fakes = [Fake(free_port()) for _ in roles]
        argv = [sys.executable, str(FAKE), "--router", f"127.0.0.1:{router_port}", "--model", model,
                "--interval", str(INTERVAL_S)]
        for fake, (role, config_hash) in zip(self.fakes, roles):
            spec = f"{role}:{config_hash}:{fake.port}" + ("" if role == "mixed" else f":{free_port()}")
            argv += ["--instance", spec]
        self.proc = Proc(argv, self.fakes[0].port)

    def wait_ready(self) -> None:
        for fake in self.fakes:
            self.proc.wait_ready(fake.url + "/health")

    def stop(self) -> None:
        self.proc.stop(signal.SIGKILL)  # fakes hold nothing worth a graceful stop


def registered(router: Proc) -> dict[int, dict]:
    """The router's ``/registered`` rows by instance port."""
    rows = httpx.get(router.url + "/registered", timeout=5.0).json()["instances"]
    return {row["port"]: row for row in rows}


def wait_request_end(fake: Fake, what: str) -> str:
    """Waits until the fake's latest request ended (aborted, done or refused) and returns how: a test that expects
    an abort fails as soon as the request completes instead, not at the wait's bound."""
    return wait_until(lambda: (kind := events(fake)[-1]["kind"]) != "start" and kind, what)


def control(fake: Fake, **settings) -> None:
    httpx.post(fake.url + "/control", json=settings, timeout=5.0).raise_for_status()


def events(fake: Fake) -> list[dict]:
    return httpx.get(fake.url + "/events", timeout=5.0).json()


class Deployment:
    """A router and its fake instances, started together and stopped together."""

    def __init__(self, router_flags: tuple[str, ...], roles: list[tuple[str, str]]):
        self.router = start_router(*router_flags)
        self.group = FakeGroup(self.router.port, roles)
        self.fakes = self.group.fakes
        try:
            self.router.wait_ready()
            self.group.wait_ready()
            wait_until(lambda: len(registered(self.router)) == len(self.fakes), "all instances registered")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> int:
        """Stops everything; returns the router's exit status."""
        self.group.stop()
        return self.router.stop()
