"""Stopping during start-up and a busy port, for one API server and for `fastdeploy serve --pd` (docs/serving.md
"Flags", "Supervision"): Ctrl-C while the engine core still loads exits 0 at once, with no crash dump of Paddle's
and no traceback; a --port in use is one line naming it and exit status 3, before anything loads. The bounds only
turn a hang into a failure (the old behaviour took 10 s and more)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from fastdeploy.entrypoints import pd_serve
from fastdeploy.entrypoints.openai.serve_args import EXIT_CANNOT_LISTEN
from tests.services import launcher

CLI = {"module": "fastdeploy.entrypoints.cli", "subcommand": "serve"}
STOP_BOUND_S = 8.0   # generous for a loaded machine; the old behaviour took 10 to 14 s
NOISE = ("FatalError", "Termination signal", "Traceback", "Exception in ASGI application")


def assert_quiet(log: str) -> None:
    for noise in NOISE:
        assert noise not in log, log[-4000:]


def ctrl_c(server: launcher.Server) -> int:
    """SIGINT to the server's process group, as a terminal's Ctrl-C; returns the exit status."""
    os.killpg(server.process.pid, signal.SIGINT)
    return server.process.wait(STOP_BOUND_S)


@pytest.mark.parametrize("how", ["api_server", "serve_pd"])
def test_ctrl_c_while_the_engine_core_loads_exits_0_at_once_and_quietly(how):
    options = CLI if how == "serve_pd" else {}
    server = launcher.start(*(("--pd",) if how == "serve_pd" else ()), wait_ready=False, **options)
    try:
        # the engine core has started and is loading Paddle (seconds); no /health 200 yet
        server.wait_until(lambda s: "engine core started" in s.log(), "an engine core loading", 60)
        time.sleep(0.5)
        status = ctrl_c(server)
    finally:
        launcher.stop(server)
    log = server.log()
    assert status == 0, log[-3000:]
    assert_quiet(log)
    if how == "serve_pd":   # each child's lines say whose they are
        assert "[prefill] " in log and "[decode] " in log and "[router] " in log, log[-3000:]


def test_a_second_ctrl_c_while_draining_ends_the_drain_without_a_traceback():
    """An impatient user's second Ctrl-C while a long stream holds the drain open: the stream ends now with an
    event naming the shutdown and the server exits 0 with no traceback (uvicorn's forced exit used to cancel the
    lifespan mid-shutdown and log one)."""
    server = launcher.start("--max-model-len", "4096", **CLI)
    try:
        body = {"model": "fd-toy", "prompt": "Hello", "max_tokens": 4000, "min_tokens": 4000, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: {")
            os.killpg(server.process.pid, signal.SIGINT)
            server.wait_until(lambda s: "draining for up to" in s.log(), "the drain", STOP_BOUND_S)
            os.killpg(server.process.pid, signal.SIGINT)
            rest = [line for line in lines if line.startswith("data: ")]
        status = server.process.wait(STOP_BOUND_S)
    finally:
        launcher.stop(server)
    log = server.log()
    assert "shutting down" in rest[-1], rest[-1:]
    assert status == 0, log[-3000:]
    assert_quiet(log)


@pytest.mark.parametrize("how", ["api_server", "serve_pd"])
def test_a_busy_port_is_one_line_naming_it_and_exit_status_3(how):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", *((CLI["module"], "serve", "--pd") if how == "serve_pd"
                                        else (launcher.API_SERVER,)),
                "--model", "fd-toy", "--host", "127.0.0.1", "--port", str(port)]
        env = {**os.environ, "PYTHONPATH": str(launcher.REPO)}
        # the process starts Python and Paddle first: on a loaded machine that alone can take the bound
        done = subprocess.run(argv, capture_output=True, text=True, timeout=STOP_BOUND_S * launcher.load_slowdown(),
                              env=env)
    assert done.returncode == EXIT_CANNOT_LISTEN == 3, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--port {port}" in lines[0] and "in use" in lines[0], done.stderr[-3000:]


def _child(name: str, tmp_path, drain_s: float) -> pd_serve._Child:
    """A child that, on SIGTERM, writes when it was signalled, drains for `drain_s`, writes when it is done, and
    exits 0; `<name>.up` tells that its handler is in place."""
    stem = str(tmp_path / name.replace(" ", "-"))
    script = ("import signal, sys, time\n"
              "def stop(*_):\n"
              f"    open({stem + '.signalled'!r}, 'w').write(str(time.monotonic()))\n"
              f"    time.sleep({drain_s})\n"
              f"    open({stem + '.done'!r}, 'w').write(str(time.monotonic()))\n"
              "    sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, stop)\n"
              f"open({stem + '.up'!r}, 'w').close()\n"
              "while True:\n    time.sleep(1)\n")
    child = pd_serve._Child(name, [sys.executable, "-c", script], 0, dict(os.environ))
    child.start()
    return child


def _read(tmp_path, name: str, what: str) -> float:
    return float((tmp_path / f"{name.replace(' ', '-')}.{what}").read_text())


def test_serve_pd_stops_the_instances_first_and_waits_for_their_drain(tmp_path, monkeypatch):
    """The supervisor gives the instances --drain-timeout-s and its grace (an instance still draining within that
    is not killed), and signals the router only once they are done."""
    monkeypatch.setattr(pd_serve, "STOP_GRACE_S", 1.0)
    instance, router = _child("decode instance", tmp_path, 2.0), _child("router", tmp_path, 0.0)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"{n}.up").exists() for n in ("decode-instance", "router")):
        assert time.monotonic() < deadline, "the test children did not start"
        time.sleep(0.05)
    pd_serve._stop([router, instance], drain_s=2.0)
    assert (instance.popen.returncode, router.popen.returncode) == (0, 0)
    assert _read(tmp_path, "router", "signalled") >= _read(tmp_path, "decode instance", "done")


def test_serve_pd_stream_cut_by_the_drain_timeout_ends_with_an_error_event_through_the_router():
    """Ctrl-C to `fastdeploy serve --pd --drain-timeout-s 1` while a long stream runs through its router: the
    stream's last event names the shutdown and its body is complete (D drained first, then the router stopped),
    and the supervisor exits 0 with no exception logged."""
    server = launcher.start("--pd", "--drain-timeout-s", "1", "--max-model-len", "4096", wait_ready=False, **CLI)
    try:
        server.wait_until(lambda s: "ready: PD deployment" in s.log(), "the ready line", launcher.START_TIMEOUT_S)
        body = {"model": "fd-toy", "prompt": "Hello", "max_tokens": 4000, "min_tokens": 4000, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: {")
            os.kill(server.process.pid, signal.SIGINT)
            rest = [line for line in lines if line.startswith("data: ")]   # raises if the body is cut off
        status = server.process.wait(60)
    finally:
        launcher.stop(server)
    assert "shutting down" in rest[-1] and "[DONE]" not in rest[-1], rest[-1:]
    assert status == 0, server.log()[-3000:]
    assert_quiet(server.log())
