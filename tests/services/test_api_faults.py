"""Process faults of one mixed instance (SERVICES §1, §8 "Faults"): SIGKILL of the engine core ends every in-flight
request with an error, /health answers 503 and the API server exits with status 1 within a few seconds so that a
supervisor restarts it (docs/serving.md "Supervision"); a silent core is declared dead the same way; SIGTERM drains
in-flight requests, exits 0 and leaves no process; a killed API server takes its engine core with it."""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import httpx

from tests.services import launcher

LONG = {"max_tokens": 4000, "min_tokens": 4000}
FLAGS = ("--max-model-len", "4096")
# Bounds on waits for what happens within a second or two; they only turn a hang into a failure.
EXIT_BOUND_S = 20.0


def _body(**fields) -> dict:
    return {"model": "fd-toy", "prompt": "Hello", **fields}


def _health_after_death(server: launcher.Server) -> None:
    """/health, if the server still answers, is 503 naming the engine core (never 200 once the core is gone)."""
    try:
        answer = httpx.get(server.url + "/health", timeout=5)
    except httpx.HTTPError:
        assert server.process.poll() is not None, "the server neither answers nor exited"
        return
    assert answer.status_code == 503 and "engine core" in answer.json()["error"]["message"], answer.text


def test_engine_core_sigkill_fails_in_flight_requests_and_server_exits_1():
    """SIGKILL the engine core mid-request: the stream ends with an error chunk, the non-streamed request gets
    503, /health is 503 while the server still answers, and the API server exits with status 1 on its own."""
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
        _health_after_death(server)
        worker.join(60)
        assert '"error"' in rest[-1] and "engine core" in rest[-1], rest[-1:]
        assert "[DONE]" not in rest[-1]
        assert results["status"] == 503
        server.wait_until(lambda s: s.process.poll() is not None, "the API server exited", EXIT_BOUND_S,
                          server_alive=False)
    finally:
        launcher.stop(server)
    assert server.process.returncode == 1, server.log()[-3000:]
    assert "exiting with status 1" in server.log()


def _completion_bytes() -> bytes:
    body = json.dumps(_body(max_tokens=4)).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def test_requests_just_after_the_engine_core_died_get_503_and_no_traceback():
    """docs/serving.md "Supervision": in the moment after the engine core is killed, before the server has noticed
    the exit, a request must not wait on the dead core (a send to it blocks): each of 16 requests sent 10 ms apart
    on connections opened beforehand gets a 503 error object naming the engine core (or, on a machine so loaded
    that the server stopped before it read the request, a closed connection), and the log holds no traceback."""
    server = launcher.start()
    try:
        connections = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(16)]
        os.kill(server.engine_core_pid(), signal.SIGKILL)
        for connection in connections:
            connection.sendall(_completion_bytes())
            time.sleep(0.01)
        answers = []
        for connection in connections:
            with connection:
                received = b""
                while chunk := connection.recv(65536):
                    received += chunk
            answers.append(received)
        server.wait_until(lambda s: s.process.poll() is not None, "the API server exited", EXIT_BOUND_S,
                          server_alive=False)
    finally:
        launcher.stop(server)
    assert any(answers), answers
    for answer in filter(None, answers):
        assert answer.startswith(b"HTTP/1.1 503"), answers
        assert "engine core" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["message"], answer
    log = server.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]


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


def test_a_stream_still_running_at_the_drain_timeout_ends_with_an_error_event_naming_the_shutdown():
    """docs/serving.md "Supervision": SIGTERM with --drain-timeout-s 1 while a 4000-token stream runs: after the
    second, the stream gets an error event naming the shutdown and a complete chunked body (no [DONE]); the server
    exits 0 and logs no exception."""
    server = launcher.start(*FLAGS, "--drain-timeout-s", "1")
    core_pid = server.engine_core_pid()
    try:
        with httpx.stream("POST", server.url + "/v1/completions", json=_body(stream=True, **LONG),
                          timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: {")
            server.process.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]   # raises if the body is cut off
        status = server.process.wait(60)
    finally:
        launcher.stop(server)
    assert '"error"' in rest[-1] and "shutting down" in rest[-1] and "--drain-timeout-s" in rest[-1], rest[-1:]
    assert "[DONE]" not in rest[-1]
    assert status == 0, server.log()[-3000:]
    assert not launcher.is_alive(core_pid)
    log = server.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]


def test_engine_core_that_stops_reporting_is_killed_and_server_exits_1():
    """A wedged engine core (SIGSTOP: alive but silent) misses its heartbeats for --heartbeat-timeout-s 1: the API
    server kills it, logs the cause and exits with status 1 (the lead's decision: death by process exit or by
    heartbeat timeout). The bound is far below the 30 s default timeout, so a check against the wrong timeout
    fails here at once."""
    server = launcher.start("--heartbeat-timeout-s", "1")
    core_pid = server.engine_core_pid()
    try:
        os.kill(core_pid, signal.SIGSTOP)
        server.wait_until(lambda s: s.process.poll() is not None, "the API server exited after the heartbeat timeout",
                          EXIT_BOUND_S, server_alive=False)
        assert server.process.returncode == 1
        assert "no heartbeat" in server.log()
        server.wait_until(lambda s: not launcher.is_alive(core_pid), "the wedged engine core killed", EXIT_BOUND_S,
                          server_alive=False)
    finally:
        if launcher.is_alive(core_pid):
            os.kill(core_pid, signal.SIGKILL)
        launcher.stop(server)


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
