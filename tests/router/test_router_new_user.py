"""What a new user found at the router: "ready" only once it listens, the prefix
cache reset fanned out to every instance, which instances served a request (log line and header), a decode instance
that stops mid-stream named as such, and error messages in the client's terms (404 without a Python list, 413 with
the client's body size). The real router in splitwise mode in front of a fake P and D."""
from __future__ import annotations

import json
import socket

import httpx
import pytest

from .harness import Deployment, control, events, registered, start_router, wait_until
from .test_router_process import run_launch


@pytest.fixture(scope="module")
def deployment():
    deploy = Deployment(("--splitwise", "--api-key", "sesame"), [("prefill", "hash-a"), ("decode", "hash-a")])
    try:
        yield deploy
    finally:
        deploy.stop()


@pytest.fixture()
def fakes(deployment):
    yield deployment.fakes
    for fake in deployment.fakes:
        control(fake, fail_status=None, break_after=None, reset_status=200)
    wait_until(lambda: all(row["outstanding"] == 0 for row in registered(deployment.router).values()),
               "nothing outstanding")


KEY = {"authorization": "Bearer sesame"}


def test_a_router_that_cannot_listen_says_so_in_one_line_and_never_ready():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_launch("--host", "127.0.0.1", "--port", str(port))
    assert result.returncode == 3, result
    assert "router ready" not in result.stdout + result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and f"--port {port}: cannot listen on 127.0.0.1:{port}" in errors[0], result.stderr


def test_ready_is_logged_once_the_router_listens():
    router = start_router()
    try:
        router.wait_ready()
        wait_until(lambda: "router ready on 127.0.0.1" in router.output(), "the ready line")
    finally:
        assert router.stop() == 0


def test_reset_prefix_cache_fans_out_to_every_instance_and_reports_each(deployment, fakes):
    prefill, decode = fakes
    assert httpx.post(deployment.router.url + "/reset_prefix_cache", timeout=10).status_code == 401
    answer = httpx.post(deployment.router.url + "/reset_prefix_cache", headers=KEY, timeout=10)
    assert answer.status_code == 200, answer.text
    rows = {row["instance"]: row for row in answer.json()["instances"]}
    assert answer.json()["status"] == "ok"
    for fake, role in ((prefill, "prefill"), (decode, "decode")):
        assert rows[f"127.0.0.1:{fake.port}"] == {"instance": f"127.0.0.1:{fake.port}", "role": role,
                                                   "status": "ok", "num_dropped_blocks": fake.port % 7}
        assert events(fake)[-1] == {"kind": "reset", "authorization": "Bearer sesame"}
    control(decode, reset_status=503)
    answer = httpx.post(deployment.router.url + "/reset_prefix_cache", headers=KEY, timeout=10)
    assert answer.status_code == 502 and answer.json()["status"] == "failed", answer.text
    rows = {row["role"]: row for row in answer.json()["instances"]}
    assert rows["prefill"]["status"] == "ok"
    assert rows["decode"]["status"] == "failed" and "answered 503: fake reset refusal 503" in rows["decode"]["error"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_each_request_names_its_prefill_and_decode_in_the_log_and_a_header(deployment, fakes, stream):
    prefill, decode = fakes
    answer = httpx.post(deployment.router.url + "/v1/completions", headers=KEY, timeout=10,
                        json={"model": "fd-toy", "prompt": "hi", "max_tokens": 2, "stream": stream})
    assert answer.status_code == 200, answer.text
    pair = f"prefill=127.0.0.1:{prefill.port}, decode=127.0.0.1:{decode.port}"
    assert answer.headers["x-fastdeploy-served-by"] == pair
    request_id = events(decode)[-1]["request_id"]
    line = f"/v1/completions {request_id}: prefill 127.0.0.1:{prefill.port}, decode 127.0.0.1:{decode.port}"
    wait_until(lambda: line in deployment.router.output(), "the request's log line")


def test_a_decode_instance_that_stops_mid_stream_is_named_as_such(deployment, fakes):
    control(fakes[1], break_after=2)
    with httpx.stream("POST", deployment.router.url + "/v1/completions", headers=KEY, timeout=10,
                      json={"model": "fd-toy", "prompt": "hi", "max_tokens": 6, "stream": True}) as answer:
        events_seen = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: {")]
    error = events_seen[-1]["error"]["message"]
    assert f"the decode instance 127.0.0.1:{fakes[1].port} stopped mid-response" in error, error


def test_unknown_model_404_lists_the_models_as_text(deployment, fakes):
    answer = httpx.post(deployment.router.url + "/v1/completions", headers=KEY, timeout=10,
                        json={"model": "gpt-4", "prompt": "x"})
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == \
        "model 'gpt-4' is not served here (registered models: fd-toy)"


def test_an_instances_413_reports_the_clients_body_size(deployment, fakes):
    control(fakes[1], fail_status=413)
    body = json.dumps({"model": "fd-toy", "prompt": "x" * 1000}).encode()
    answer = httpx.post(deployment.router.url + "/v1/completions", headers={**KEY, "content-type":
                                                                            "application/json"},
                        content=body, timeout=10)
    assert answer.status_code == 413
    message = answer.json()["error"]["message"]
    assert message.startswith(f"request body of {len(body)} bytes exceeds the limit of instance 127.0.0.1:"), \
        message
