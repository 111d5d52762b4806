"""Process faults of one mixed instance (SERVICES §1, §8 "Faults"): SIGKILL of the engine core turns /health 503 and
ends every in-flight request with an error while the API server stays up; a silent core is declared dead; SIGTERM
drains in-flight requests, exits 0 and leaves no process; a killed API server takes its engine core with it."""
from __future__ import annotations

import os
import signal
import threading

import httpx
from openai import APIStatusError, OpenAI

from tests.services import launcher

LONG = {"max_tokens": 4000, "min_tokens": 4000}
FLAGS = ("--max-model-len", "4096")


def _body(**fields) -> dict:
    return {"model": "fd-toy", "prompt": "Hello", **fields}


def test_engine_core_sigkill_fails_in_flight_requests_and_server_stays_up():
    """SIGKILL the engine core mid-request: the stream ends with an error chunk, the non-streamed request gets an
    error status, /health is 503, new requests get 503, /ping still answers; SIGTERM then exits 0."""
    server = launcher.start(*FLAGS)
    try:
        results = {}

        def non_streamed():
            results["status"] = httpx.post(server.url + "/v1/completions", json=_body(**LONG), timeout=60).status_code

        worker = threading.Thread(target=non_streamed)
        with httpx.stream("POST", server.url + "/v1/completions", json=_body(stream=True, **LONG),
                          timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: {")
            worker.start()
            server.wait_until(lambda s: s.metrics()["fastdeploy:num_requests_running"] == 2, "both requests running")
            os.kill(server.engine_core_pid(), signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data: ")]
        worker.join(60)
        assert '"error"' in rest[-1] and "engine core" in rest[-1], rest[-1:]
        assert "[DONE]" not in rest[-1]
        assert results["status"] == 503
        server.wait_until(lambda s: s.health() == 503, "/health 503 after the engine core died")
        assert httpx.get(server.url + "/ping").status_code == 200
        client = OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0, timeout=60)
        try:
            client.completions.create(model="fd-toy", prompt="Hello", max_tokens=2)
            raise AssertionError("a request to a dead engine succeeded")
        except APIStatusError as error:
            assert error.status_code == 503
        assert server.process.poll() is None
    finally:
        status = launcher.stop(server)
    assert status == 0, server.log()[-3000:]


def test_sigterm_drains_in_flight_requests_then_exits_0_without_orphans():
    """SIGTERM while a stream runs (about 1500 steps, seconds): the server stops accepting, the stream still
    completes with its finish reason and [DONE], the server exits 0 and the engine core is gone. (This server also
    serves /metrics on its own --metrics-port, as FastDeploy does.)"""
    metrics_port = launcher.free_port()
    server = launcher.start(*FLAGS, "--metrics-port", str(metrics_port))
    core_pid = server.engine_core_pid()
    try:
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert "fastdeploy:num_requests_running" in metrics
        assert httpx.get(server.url + "/metrics").status_code == 404
        with httpx.stream("POST", server.url + "/v1/completions",
                          json=_body(stream=True, max_tokens=1500, min_tokens=1500), timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: {")
            server.process.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2]
        status = server.process.wait(60)
    finally:
        launcher.stop(server)
    assert status == 0, server.log()[-3000:]
    assert not launcher.is_alive(core_pid)
    assert "shutdown: signal 15" in server.log()


def test_engine_core_that_stops_reporting_is_killed_and_declared_dead():
    """A wedged engine core (SIGSTOP: alive but silent) misses its heartbeats: the API server kills it and
    /health turns 503 naming the cause (the lead's decision: death by process exit or by heartbeat timeout)."""
    server = launcher.start("--heartbeat-timeout-s", "1")
    try:
        core_pid = server.engine_core_pid()
        os.kill(core_pid, signal.SIGSTOP)
        server.wait_until(lambda s: s.health() == 503, "/health 503 after the heartbeat timeout")
        assert "no heartbeat" in httpx.get(server.url + "/health").json()["error"]["message"]
        server.wait_until(lambda s: not launcher.is_alive(core_pid), "the wedged engine core killed")
    finally:
        status = launcher.stop(server)
    assert status == 0


def test_engine_core_exits_when_its_api_server_is_killed():
    """SERVICES §1: a parent that dies takes its engine core with it (no orphan)."""
    server = launcher.start()
    core_pid = server.engine_core_pid()
    try:
        server.process.kill()
        server.process.wait(30)
        server.wait_until(lambda s: not launcher.is_alive(core_pid), "the orphaned engine core gone",
                          server_alive=False)
    finally:
        launcher.stop(server)
