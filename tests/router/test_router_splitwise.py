"""The real router process in splitwise mode in front of fake P and D instances: pairing by config hash, the
request id and ``disaggregate_info`` sent to both, D's answer to the client, P's failure aborting D, D's
failure aborting P, and a client disconnect closing both (SERVICES §5, §6). Each test restores the fakes."""
from __future__ import annotations

import re

import httpx
import openai
import pytest

from .harness import Deployment, control, events, registered, wait_request_end, wait_until

REQUEST_ID = re.compile(r"^(cmpl|chatcmpl)-[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def deployment():
    # P and D share hash-a; the second D (hash-b) has no compatible P and must never be chosen.
    deploy = Deployment(("--splitwise",), [("prefill", "hash-a"), ("decode", "hash-a"), ("decode", "hash-b")])
    try:
        yield deploy
    finally:
        assert deploy.stop() == 0, "router must exit 0 on SIGTERM (SERVICES §1)"


@pytest.fixture()
def fakes(deployment):
    prefill, decode, stranger = deployment.fakes
    yield prefill, decode, stranger
    for fake in deployment.fakes:
        control(fake, health=200, fail_status=None, token_delay=0.0, prefill_delay=0.0)
    wait_until(lambda: all(row["outstanding"] == 0 and row["healthy"]
                           for row in registered(deployment.router).values()),
               "every instance healthy with nothing outstanding")


@pytest.fixture()
def client(deployment):
    with openai.OpenAI(base_url=deployment.router.url + "/v1", api_key="unused", max_retries=0,
                       timeout=30.0) as oai:
        yield oai


def connector(deployment, fake) -> str:
    return registered(deployment.router)[fake.port]["connector_addr"]


@pytest.mark.parametrize("stream", [False, True])
def test_pd_request_goes_to_compatible_pair_with_same_id(deployment, fakes, client, stream):
    """SERVICES §5, §6: the router pairs P and D with equal config hashes, names the request, sends both the
    same disaggregate_info, and the client gets D's answer."""
    prefill, decode, stranger = fakes
    before = len(events(stranger))
    if stream:
        chunks = list(client.completions.create(model="fd-toy", prompt="hi", max_tokens=3, stream=True))
        text = "".join(chunk.choices[0].text for chunk in chunks)
        response_id = chunks[0].id
    else:
        answer = client.completions.create(model="fd-toy", prompt="hi", max_tokens=3)
        text, response_id = answer.choices[0].text, answer.id
    assert text == "".join(f"p{decode.port}t{i} " for i in range(3))
    d_event, p_event = events(decode)[-1], wait_until(lambda: events(prefill)[-1], "P's request")
    info = d_event["disaggregate_info"]
    assert REQUEST_ID.match(info["request_id"]) and info["request_id"].startswith("cmpl-")
    assert response_id == info["request_id"]
    assert info == {"request_id": info["request_id"], "prefill_addr": connector(deployment, prefill),
                    "decode_addr": connector(deployment, decode)}
    assert p_event["disaggregate_info"] == info
    wait_until(lambda: events(prefill)[-1]["kind"] == "done", "P finished, not aborted")
    assert len(events(stranger)) == before


def test_chat_request_id_has_chat_prefix(deployment, fakes, client):
    """SERVICES §6: a chat request is named chatcmpl-<hex>."""
    _, decode, _ = fakes
    answer = client.chat.completions.create(model="fd-toy", messages=[{"role": "user", "content": "x"}],
                                            max_tokens=2)
    assert answer.id.startswith("chatcmpl-") and REQUEST_ID.match(answer.id)
    assert events(decode)[-1]["disaggregate_info"]["request_id"] == answer.id


def test_no_compatible_pair_is_503_at_once(deployment, fakes):
    """SERVICES §5: with the only compatible D unhealthy, the healthy D of another config hash is not used:
    503 at once, naming the hashes."""
    _, decode, stranger = fakes
    before = len(events(stranger))
    assert httpx.get(deployment.router.url + "/health", timeout=10.0).status_code == 200
    control(decode, health=503)
    wait_until(lambda: not registered(deployment.router)[decode.port]["healthy"], "D unhealthy")
    answer = httpx.post(deployment.router.url + "/v1/completions", json={"prompt": "x"}, timeout=10.0)
    assert answer.status_code == 503
    assert "config_hash" in answer.json()["error"]["message"]
    assert len(events(stranger)) == before
    # ... and the router says so on /health (a healthy P and a healthy D exist, but no compatible pair)
    health = httpx.get(deployment.router.url + "/health", timeout=10.0)
    assert health.status_code == 503 and "config_hash" in health.json()["error"]["message"]
    assert health.json()["healthy"] == {"mixed": 0, "prefill": 1, "decode": 1}


@pytest.mark.parametrize("status, expected", [(400, 400), (500, 502)])
def test_prefill_error_aborts_decode_and_reaches_client(deployment, fakes, status, expected):
    """SERVICES §6 (P refuses or fails): the client gets P's error (4xx unchanged, 5xx as 502) and the
    router closes D's request, which D sees as an abort."""
    prefill, decode, _ = fakes
    control(decode, token_delay=0.2)
    control(prefill, fail_status=status, prefill_delay=0.1)
    answer = httpx.post(deployment.router.url + "/v1/completions", json={"prompt": "x", "max_tokens": 50},
                        timeout=30.0)
    assert answer.status_code == expected
    if status < 500:
        assert answer.json()["error"]["message"] == f"fake refusal {status}"
    else:
        assert f"prefill instance 127.0.0.1:{prefill.port} answered 500" in answer.json()["error"]["message"]
    wait_until(lambda: events(decode)[-1]["kind"] == "aborted", "D aborted")


def test_prefill_error_mid_stream_becomes_error_chunk(deployment, fakes, client):
    """SERVICES §3, §6: when P fails after D's stream started, the client gets an error chunk, the stream
    ends, and D's request is closed."""
    prefill, decode, _ = fakes
    control(decode, token_delay=0.1)
    control(prefill, fail_status=500, prefill_delay=0.5)
    received = []
    with pytest.raises(openai.APIError, match="answered 500"):
        for chunk in client.completions.create(model="fd-toy", prompt="x", max_tokens=100, stream=True):
            received.append(chunk.choices[0].text)
    assert received and len(received) < 100
    wait_until(lambda: events(decode)[-1]["kind"] == "aborted", "D aborted")


def test_decode_error_passes_through_and_aborts_prefill(deployment, fakes):
    """SERVICES §6 (D refuses): D's 4xx reaches the client unchanged and P's request is closed at once, so P
    never waits for a reservation that will not come."""
    prefill, decode, _ = fakes
    control(decode, fail_status=429)
    control(prefill, prefill_delay=20.0)
    answer = httpx.post(deployment.router.url + "/v1/completions", json={"prompt": "x"}, timeout=30.0)
    assert answer.status_code == 429
    assert answer.json()["error"]["message"] == "fake refusal 429"
    wait_until(lambda: events(prefill)[-1]["kind"] == "aborted", "P aborted")


def test_client_disconnect_aborts_prefill_and_decode(deployment, fakes):
    """SERVICES §6 (client disconnects): closing the client's stream closes the router's requests to P and
    to D; both see the abort and nothing stays outstanding."""
    prefill, decode, _ = fakes
    control(decode, token_delay=0.1)   # 6 s for D's stream, 8 s for P's answer, unless aborted
    control(prefill, prefill_delay=8.0)
    with httpx.Client(base_url=deployment.router.url, timeout=30.0) as http:
        with http.stream("POST", "/v1/completions", json={"prompt": "x", "max_tokens": 60, "stream": True}) as s:
            assert next(s.iter_lines()).startswith("data: ")
    assert wait_request_end(decode, "D's request ended") == "aborted"
    assert wait_request_end(prefill, "P's request ended") == "aborted"


def test_models_come_from_a_decode_instance(deployment, fakes, client):
    """SERVICES §3: GET /v1/models through a splitwise router answers from a healthy D."""
    assert [model.id for model in client.models.list()] == ["fd-toy"]


def test_tokenize_detokenize_and_version_are_answered_by_a_decode_instance(deployment, fakes):
    """vLLM's /tokenize, /detokenize and /version through the router: a D answers (every instance has the same
    tokenizer and chat template), the body passed unchanged."""
    with httpx.Client(base_url=deployment.router.url, timeout=30.0) as http:
        for path, body in (("/tokenize", {"prompt": "Hi"}), ("/detokenize", {"tokens": [1, 2]})):
            answer = http.post(path, json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"role": "decode", "path": path, "body": body}
        version = http.get("/version")
        assert version.status_code == 200 and version.json()["role"] == "decode", version.text
