"""Requests sent straight to a prefill (P) and a decode (D) API server (docs/serving.md, "PD instances"): a plain
request is refused at once with "send requests to the router" and leaves the instance serving; a pair sent as the
router sends it (the same body with `disaggregate_info` to both) is served, with several prompts and samples
paired by their derived ids; a request id already in flight is refused with 409 while the first runs unharmed.

No router runs: D's registration target is a closed port (it retries quietly), and each body names the peer
connectors the router would have named.
"""
from __future__ import annotations

import json
import threading

import httpx
import pytest

from fastdeploy import LLM, SamplingParams
from tests.services import launcher

PLAIN = [("/v1/completions", {"model": "fd-toy", "prompt": "Hello", "max_tokens": 4}),
         ("/v1/chat/completions", {"model": "fd-toy", "messages": [{"role": "user", "content": "Hi"}],
                                   "max_tokens": 4})]


# Room for a first request that is still decoding when its duplicate arrives: fd-toy decodes 400 tokens in well
# under a second here, which a loaded CI machine can spend between two lines of the test (it did once).
MAX_MODEL_LEN = 4096
LONG = 4000


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    logs = tmp_path_factory.mktemp("pd-roles")
    dead_router = f"127.0.0.1:{launcher.free_port()}"
    p_port, d_port = launcher.free_port(), launcher.free_port()
    common = ("--router", dead_router, "--health-interval-secs", "0.5", "--drain-timeout-s", "2",
              "--max-model-len", str(MAX_MODEL_LEN))
    prefill = launcher.start("--splitwise-role", "prefill", "--pd-comm-port", str(p_port), *common,
                             wait_ready=False, log_dir=logs)
    decode = launcher.start("--splitwise-role", "decode", "--pd-comm-port", str(d_port), *common,
                            wait_ready=False, log_dir=logs)
    try:
        launcher.await_ready(prefill)
        launcher.await_ready(decode)
        yield prefill, decode, f"127.0.0.1:{p_port}", f"127.0.0.1:{d_port}"
    finally:
        for server in (prefill, decode):
            launcher.stop(server)
            print(f"---- {' '.join(server.flags)} ----\n{server.log()[-4000:]}")


def _intact(*servers: launcher.Server) -> None:
    for server in servers:
        assert "Traceback" not in server.log(), server.log()[-4000:]
        assert server.health() == 200
        server.wait_until(launcher.nothing_held, "nothing held", timeout_s=30)


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("path,body", PLAIN, ids=["completions", "chat"])
def test_plain_request_to_p_or_d_is_refused_at_once(pair, role, path, body):
    """Today D's engine core died and P hung: now a 400 that says where requests go, and the instance serves on."""
    server = pair[0] if role == "prefill" else pair[1]
    response = httpx.post(server.url + path, json=body, timeout=10)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "send requests to the router" in error["message"] and error["param"] is None
    _intact(server)


@pytest.mark.parametrize("fields,param", [
    ({"bootstrap_host": "127.0.0.1", "bootstrap_port": 9, "bootstrap_room": 7,
      "disaggregate_info": {"request_id": "both", "prefill_addr": "127.0.0.1:9"}}, "bootstrap_room"),
    ({"bootstrap_port": 9}, "bootstrap_room"),
    ({"disaggregate_info": {"request_id": "only-an-id"}}, "disaggregate_info.prefill_addr"),
    ({"disaggregate_info": {"request_id": "bad-addr", "prefill_addr": "nowhere"}}, "disaggregate_info.prefill_addr"),
], ids=["both-pairings", "bootstrap-port-only", "no-prefill-addr", "prefill-addr-not-host-port"])
def test_pairing_fields_d_cannot_use_are_refused(pair, fields, param):
    """One pairing scheme per request, SGLang's three bootstrap fields together; D needs P's connector address."""
    response = httpx.post(pair[1].url + "/v1/completions", json={**PLAIN[0][1], **fields}, timeout=10)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    _intact(pair[1])


def _paired(pair, request_id: str, body: dict, timeout_s: float = 120) -> tuple[dict, httpx.Response]:
    """Send `body` to P and D as the router does; returns (P's answer, D's response)."""
    prefill, decode, p_addr, d_addr = pair
    sent = {**body, "disaggregate_info": {"request_id": request_id, "prefill_addr": p_addr, "decode_addr": d_addr}}
    answers = {}
    to_p = threading.Thread(target=lambda: answers.update(
        p=httpx.post(prefill.url + "/v1/completions", json=sent, timeout=timeout_s).json()))
    to_p.start()
    try:
        d_response = httpx.post(decode.url + "/v1/completions", json=sent, timeout=timeout_s)
    finally:
        to_p.join(timeout_s)
    return answers["p"], d_response


def test_several_prompts_and_samples_pair_by_derived_ids(pair):
    """Two prompts x n = 2 through P and D: each engine request is `<id>-<index>` on both sides, so the four pair
    up and D's choices equal the in-process LLM's greedy texts; P answers its hand-off status."""
    prompts = ["Hello", "The cat sat"]
    want = [out.outputs.text for out in LLM(model="fd-toy").generate(
        prompts, SamplingParams(max_tokens=6), use_tqdm=False)]
    handoff, response = _paired(pair, "cmpl-pd-multi", {"model": "fd-toy", "prompt": prompts, "n": 2,
                                                         "max_tokens": 6})
    assert response.status_code == 200, response.text
    choices = sorted(response.json()["choices"], key=lambda c: c["index"])
    assert [c["text"] for c in choices] == [want[0], want[0], want[1], want[1]]
    assert response.json()["id"] == "cmpl-pd-multi"
    assert handoff == {"id": "cmpl-pd-multi", "object": "pd.handoff", "status": "handed_off"}
    _intact(pair[0], pair[1])


def test_a_request_id_in_flight_is_refused_and_the_first_is_unharmed(pair):
    """The same `disaggregate_info.request_id` twice: on P while the first waits for D's reservation, on D while
    the first decodes. The second gets 409 naming the field; the first completes as if alone."""
    prefill, decode, p_addr, d_addr = pair
    body = {"model": "fd-toy", "prompt": "Hello", "max_tokens": LONG, "min_tokens": LONG, "stream": True,
            "disaggregate_info": {"request_id": "cmpl-dup", "prefill_addr": p_addr, "decode_addr": d_addr}}
    results = {}
    first_p = threading.Thread(target=lambda: results.update(
        p=httpx.post(prefill.url + "/v1/completions", json=body, timeout=120).text))
    first_p.start()
    prefill.wait_until(lambda s: s.metrics()["fastdeploy:num_requests_waiting"] >= 1,
                       "P holding the first request (waiting for D's reservation)", timeout_s=30)
    again = httpx.post(prefill.url + "/v1/completions", json=body, timeout=10)
    assert again.status_code == 409 and again.json()["error"]["param"] == "disaggregate_info.request_id"
    with httpx.stream("POST", decode.url + "/v1/completions", json=body, timeout=120) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: {")      # D decodes the first request
        duplicate = httpx.post(decode.url + "/v1/completions", json=body, timeout=30)
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    first_p.join(120)
    assert duplicate.status_code == 409, duplicate.text
    assert duplicate.json()["error"]["param"] == "disaggregate_info.request_id"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert '"handed_off"' in results["p"]
    _intact(prefill, decode)
