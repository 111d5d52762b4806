"""The real router process in mixed mode in front of two fake mixed instances: registration, forwarding and
passthrough, least-outstanding choice, health hysteresis, heartbeat expiry, disconnect and metrics (SERVICES §5,
§6). Each test leaves the deployment as it found it (every fake healthy, heartbeating, answering)."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fastdeploy.router.router import MAX_BODY_BYTES

from .harness import Deployment, control, events, registered, wait_request_end, wait_until


@pytest.fixture(scope="module")
def deployment():
    deploy = Deployment((), [("mixed", "hash-a"), ("mixed", "hash-a")])
    try:
        yield deploy
    finally:
        assert deploy.stop() == 0, "router must exit 0 on SIGTERM (SERVICES §1)"


@pytest.fixture()
def client(deployment):
    with openai.OpenAI(base_url=deployment.router.url + "/v1", api_key="unused", max_retries=0,
                       timeout=30.0) as oai:
        yield oai


def served_by(text: str) -> int:
    """The port of the fake instance that produced ``text`` (its tokens read ``p<port>t<i>``)."""
    return int(text.split("t", 1)[0][1:])


def port_of_event(line: str) -> int:
    """The serving port named by one SSE line ``data: {...}`` of a fake instance's completion stream."""
    return served_by(json.loads(line[len("data: "):])["choices"][0]["text"])


def metric(deployment, name: str, **labels) -> float | None:
    text = httpx.get(deployment.router.url + "/metrics", timeout=5.0).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def test_registered_lists_instances_with_role_health_and_load(deployment):
    """SERVICES §5: GET /registered lists each instance with its role, health and outstanding requests."""
    rows = registered(deployment.router)
    assert set(rows) == {fake.port for fake in deployment.fakes}
    for row in rows.values():
        assert (row["role"], row["healthy"], row["outstanding"], row["model"]) == ("mixed", True, 0, "fd-toy")
    health = httpx.get(deployment.router.url + "/health", timeout=5.0).json()
    assert health["healthy"] == {"mixed": 2, "prefill": 0, "decode": 0}


def test_register_refuses_bad_heartbeat_with_400_naming_field(deployment):
    """SERVICES §5, §3: an invalid registration is a 400 OpenAI error whose param names the field."""
    good = {"role": "mixed", "host": "127.0.0.1", "port": 1, "connector_addr": None, "model": "m",
            "config_hash": "h", "max_num_seqs": 1, "version": "1"}
    for field, value in [("port", "x"), ("role", "both"), ("surprise", 1), ("max_num_seqs", -1)]:
        answer = httpx.post(deployment.router.url + "/register", json={**good, field: value}, timeout=5.0)
        assert answer.status_code == 400
        assert answer.json()["error"]["param"] == field
    answer = httpx.post(deployment.router.url + "/register", content=b"{not json", timeout=5.0,
                        headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert set(registered(deployment.router)) == {fake.port for fake in deployment.fakes}


@pytest.mark.parametrize("stream", [False, True])
def test_completion_passes_through_unchanged(client, deployment, stream):
    """SERVICES §5: the router forwards the body and returns the instance's JSON or SSE stream unchanged."""
    if stream:
        chunks = list(client.completions.create(model="fd-toy", prompt="hi", max_tokens=3, stream=True))
        text = "".join(chunk.choices[0].text for chunk in chunks)
    else:
        answer = client.completions.create(model="fd-toy", prompt="hi", max_tokens=3)
        text = answer.choices[0].text
        assert answer.usage.completion_tokens == 3
    port = served_by(text)
    assert port in {fake.port for fake in deployment.fakes}
    assert text == "".join(f"p{port}t{i} " for i in range(3))


def test_chat_completion_streams_deltas(client):
    """SERVICES §3, §5: chat completions go through the router the same way, streaming deltas."""
    chunks = list(client.chat.completions.create(model="fd-toy", messages=[{"role": "user", "content": "x"}],
                                                 max_tokens=2, stream=True))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text.count("t") == 2


def test_models_lists_instance_model(client):
    """SERVICES §3: GET /v1/models through the router answers from a healthy instance."""
    assert [model.id for model in client.models.list()] == ["fd-toy"]


def test_unknown_model_is_404_naming_model(deployment):
    """SERVICES §3: a model no instance serves is a 404 naming the field."""
    answer = httpx.post(deployment.router.url + "/v1/completions", json={"model": "gpt-4", "prompt": "x"},
                        timeout=5.0)
    assert answer.status_code == 404
    assert answer.json()["error"]["param"] == "model"


def test_unknown_route_is_404_error_object(deployment):
    """SERVICES §3: an unknown route is a 404 OpenAI error object and a wrong method a 405, never a 500."""
    answer = httpx.get(deployment.router.url + "/v2/nothing", timeout=10.0)
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == 404
    answer = httpx.get(deployment.router.url + "/v1/completions", timeout=10.0)
    assert answer.status_code == 405
    assert answer.json()["error"]["code"] == 405


@pytest.mark.parametrize("body, param", [(b"[1, 2]", None), (b"{oops", None),
                                         (b'{"model": 3, "prompt": "x"}', "model"),
                                         (b'{"prompt": "x", "disaggregate_info": {}}', "disaggregate_info")])
def test_bad_body_is_400(deployment, body, param):
    """SERVICES §3: a body the router cannot forward is a 400 OpenAI error, never a 500."""
    answer = httpx.post(deployment.router.url + "/v1/completions", content=body, timeout=5.0,
                        headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param


def test_chunked_body_past_the_limit_is_413(deployment):
    """docs/serving.md "Limits": a body sent without Content-Length (chunked) is counted as it arrives; one byte
    past the router's limit is a 413 error object, and nothing reaches an instance."""
    def chunks(total: int, size: int = 1 << 20):
        yield b'{"model": "fd-toy", "prompt": "'
        sent = len(b'{"model": "fd-toy", "prompt": "')
        while sent < total:
            part = b"x" * min(size, total - sent)
            sent += len(part)
            yield part

    before = sum(len(events(fake)) for fake in deployment.fakes)
    answer = httpx.post(deployment.router.url + "/v1/completions", content=chunks(MAX_BODY_BYTES + 1),
                        headers={"content-type": "application/json"}, timeout=30.0)
    assert answer.status_code == 413, answer.text[:500]
    assert answer.json()["error"]["code"] == 413
    assert sum(len(events(fake)) for fake in deployment.fakes) == before


def test_instance_4xx_passes_through_and_5xx_becomes_502(deployment):
    """SERVICES §5: an instance's 4xx body and status reach the client unchanged; its 5xx becomes a 502."""
    try:
        for fake in deployment.fakes:
            control(fake, fail_status=422)
        answer = httpx.post(deployment.router.url + "/v1/completions", json={"prompt": "x"}, timeout=10.0)
        assert answer.status_code == 422
        assert answer.json()["error"]["message"] == "fake refusal 422"
        for fake in deployment.fakes:
            control(fake, fail_status=500)
        answer = httpx.post(deployment.router.url + "/v1/completions", json={"prompt": "x"}, timeout=10.0)
        assert answer.status_code == 502
        assert "answered 500" in answer.json()["error"]["message"]
    finally:
        for fake in deployment.fakes:
            control(fake, fail_status=None)


def test_least_outstanding_instance_gets_the_next_request(deployment):
    """SERVICES §5: while one instance holds a slow stream, new requests go to the other one."""
    for fake in deployment.fakes:
        control(fake, token_delay=0.1)
    try:
        with httpx.Client(base_url=deployment.router.url, timeout=30.0) as http:
            with http.stream("POST", "/v1/completions",
                             json={"prompt": "x", "max_tokens": 100, "stream": True}) as slow:
                # Keep the line iterator alive: dropping it would close the stream (a client disconnect).
                lines = slow.iter_lines()
                busy = port_of_event(next(lines))
                assert registered(deployment.router)[busy]["outstanding"] == 1
                for _ in range(3):
                    answer = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).json()
                    assert served_by(answer["choices"][0]["text"]) != busy
    finally:
        for fake in deployment.fakes:
            control(fake, token_delay=0.0)
    wait_until(lambda: all(row["outstanding"] == 0 for row in registered(deployment.router).values()),
               "outstanding counts back to 0")


def test_unhealthy_instance_gets_no_requests_until_two_successes(deployment):
    """SERVICES §5: /health failing 3 times makes an instance unhealthy (no new requests); it returns after
    passing again (2 successes)."""
    sick, well = deployment.fakes
    control(sick, health=503)
    try:
        row = wait_until(lambda: (r := registered(deployment.router)[sick.port]) and not r["healthy"] and r,
                         "instance marked unhealthy")
        assert row["consecutive_failures"] >= 3
        for _ in range(4):
            answer = httpx.post(deployment.router.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                                timeout=10.0).json()
            assert served_by(answer["choices"][0]["text"]) == well.port
        assert metric(deployment, "fastdeploy_router:instance_healthy", instance=f"127.0.0.1:{sick.port}",
                      role="mixed", config_hash="hash-a") == 0.0
    finally:
        control(sick, health=200)
    row = wait_until(lambda: (r := registered(deployment.router)[sick.port]) and r["healthy"] and r,
                     "instance healthy again")
    assert row["consecutive_successes"] >= 2


def test_silent_instance_is_dropped_and_returns_on_heartbeat(deployment):
    """SERVICES §5: an instance that stops registering for 3 intervals is dropped; its next heartbeat
    registers it again."""
    quiet = deployment.fakes[1]
    control(quiet, heartbeat=False)
    try:
        wait_until(lambda: quiet.port not in registered(deployment.router), "silent instance dropped")
    finally:
        control(quiet, heartbeat=True)
    wait_until(lambda: quiet.port in registered(deployment.router), "instance registered again")


def test_no_healthy_instance_is_503_at_once(deployment):
    """SERVICES §5: with no healthy instance the router answers 503 (OpenAI error) instead of waiting."""
    for fake in deployment.fakes:
        control(fake, health=503)
    try:
        wait_until(lambda: not any(r["healthy"] for r in registered(deployment.router).values()),
                   "all instances unhealthy")
        answer = httpx.post(deployment.router.url + "/v1/completions", json={"prompt": "x"}, timeout=10.0)
        assert answer.status_code == 503
        assert "no healthy mixed instance" in answer.json()["error"]["message"]
        assert httpx.get(deployment.router.url + "/v1/models", timeout=10.0).status_code == 503
        health = httpx.get(deployment.router.url + "/health", timeout=10.0)
        assert health.status_code == 503 and "no healthy mixed instance" in health.json()["error"]["message"]
    finally:
        for fake in deployment.fakes:
            control(fake, health=200)
    wait_until(lambda: all(r["healthy"] for r in registered(deployment.router).values()), "instances healthy")
    assert httpx.get(deployment.router.url + "/health", timeout=10.0).status_code == 200


def test_client_disconnect_closes_the_upstream_stream(deployment):
    """SERVICES §6 (client disconnects): closing the client's stream closes the router's stream to the
    instance, which sees the abort; nothing stays outstanding."""
    for fake in deployment.fakes:
        control(fake, token_delay=0.1)
    try:
        with httpx.Client(base_url=deployment.router.url, timeout=30.0) as http:
            with http.stream("POST", "/v1/completions",   # 10 s unless aborted
                             json={"prompt": "x", "max_tokens": 100, "stream": True}) as answer:
                port = port_of_event(next(answer.iter_lines()))
        fake = next(f for f in deployment.fakes if f.port == port)
        assert wait_request_end(fake, "the upstream stream ended") == "aborted"
    finally:
        for fake in deployment.fakes:
            control(fake, token_delay=0.0)
    wait_until(lambda: all(row["outstanding"] == 0 for row in registered(deployment.router).values()),
               "outstanding counts back to 0")
    assert metric(deployment, "fastdeploy_router:client_disconnects_total") >= 1


def test_client_disconnect_during_json_request_aborts_it(deployment):
    """SERVICES §6 (client disconnects): a non-streaming request whose client leaves is cancelled upstream
    too (the router watches the client while it waits)."""
    for fake in deployment.fakes:
        control(fake, token_delay=0.2)   # 20 s unless aborted
    try:
        seen = {fake.port: len(events(fake)) for fake in deployment.fakes}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(deployment.router.url + "/v1/completions", json={"prompt": "x", "max_tokens": 100},
                       timeout=httpx.Timeout(10.0, read=0.5))
        fake = wait_until(lambda: next((f for f in deployment.fakes if len(events(f)) > seen[f.port]), None),
                          "the request reached an instance")
        assert wait_request_end(fake, "the upstream request ended") == "aborted"
    finally:
        for fake in deployment.fakes:
            control(fake, token_delay=0.0)
    wait_until(lambda: all(row["outstanding"] == 0 for row in registered(deployment.router).values()),
               "outstanding counts back to 0")


def test_metrics_count_requests_per_instance(deployment):
    """SERVICES §4: the router exports requests per instance with prometheus-client."""
    for fake in deployment.fakes:
        assert metric(deployment, "fastdeploy_router:requests_total", instance=f"127.0.0.1:{fake.port}",
                      role="mixed") >= 1
