"""P's and D's metrics by value after requests through the router (SERVICES §4, docs/serving.md "Metrics"): each
token counted once, on the instance whose model computed it (t0 on P, the rest on D); a hand-off is neither a
success nor an abort on P; completions, per-request histograms and speculative decoding on D; the prompt and
max_tokens of each request on both; hand-offs sent equal hand-offs received; nothing held afterwards. And a
request's `seed` reaches P and D: seeded sampling at temperature 1 repeats through the router."""
from __future__ import annotations

import httpx
import pytest

from tests.services import deployment as deploy

K = 1
P = "fastdeploy:"
BODIES = [{"prompt": "On Monday, Judy", "max_tokens": 12},
          {"prompt": "Hello", "max_tokens": 1},                      # t0 ends it: D finishes it at receipt
          {"prompt": "abc", "max_tokens": 9, "min_tokens": 9},
          {"prompt": [256, 72, 105, 33], "max_tokens": 5}]


@pytest.fixture(scope="module")
def pd():
    deployment = deploy.pd_deployment(k=K)
    try:
        yield deployment
    finally:
        deployment.stop()


def _delta(before: dict, after: dict) -> dict:
    return {name: value - before.get(name, 0) for name, value in after.items()}


def test_prefill_and_decode_count_as_fastdeploy_does(pd):
    prefill, decode = pd.instances["prefill"], pd.instances["decode"]
    before = {"p": prefill.metrics(), "d": decode.metrics()}
    with httpx.Client(base_url=pd.router.url, timeout=60) as http:
        answers = [http.post("/v1/completions", json={"model": "fd-toy", **body}) for body in BODIES]
        answers.append(http.post("/v1/chat/completions", json={
            "model": "fd-toy", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}))
    assert [a.status_code for a in answers] == [200] * len(answers), [a.text for a in answers]
    answers = [a.json() for a in answers]
    pd.wait_nothing_held()
    p, d = _delta(before["p"], prefill.metrics()), _delta(before["d"], decode.metrics())
    n = len(answers)
    prompt = sum(a["usage"]["prompt_tokens"] for a in answers)
    completion = sum(a["usage"]["completion_tokens"] for a in answers)
    max_tokens = sum(body["max_tokens"] for body in BODIES) + 4
    reasons = [a["choices"][0]["finish_reason"] for a in answers]
    for side in (p, d):       # what every instance a request reaches counts
        assert side[P + "requests_number_total"] == n
        assert side[P + "prompt_tokens_total"] == prompt
        assert (side[P + "request_prompt_tokens_count"], side[P + "request_prompt_tokens_sum"]) == (n, prompt)
        assert (side[P + "request_params_max_tokens_count"], side[P + "request_params_max_tokens_sum"]) == (
            n, max_tokens)
        assert side.get(P + "request_aborted_total", 0) == 0
    # P: its model computed t0 of each request; its part ends with the hand-off
    assert p[P + "generation_tokens_total"] == n
    assert p[P + "pd_handoffs_total{direction=sent}"] == n
    assert p.get(P + "send_cache_failed_num_total", 0) == 0
    assert sum(v for name, v in p.items() if name.startswith(P + "request_success_total")) == 0
    for name in ("request_queue_time_seconds", "request_prefill_time_seconds", "time_to_first_token_seconds"):
        assert p[f"{P}{name}_count"] == n, name
    for name in ("request_decode_time_seconds", "request_inference_time_seconds", "request_generation_tokens",
                 "e2e_request_latency_seconds"):
        assert p[f"{P}{name}_count"] == 0, name
    # D: the rest of every request's tokens, and the completions as the client saw them
    assert d[P + "generation_tokens_total"] == completion - n
    assert d[P + "pd_handoffs_total{direction=received}"] == n
    for reason in ("stop", "length"):
        assert d.get(f"{P}request_success_total{{finish_reason={reason}}}", 0) == reasons.count(reason)
    assert (d[P + "request_generation_tokens_count"], d[P + "request_generation_tokens_sum"]) == (n, completion)
    for name in ("request_queue_time_seconds", "request_decode_time_seconds", "request_inference_time_seconds",
                 "e2e_request_latency_seconds", "time_to_first_token_seconds"):
        assert d[f"{P}{name}_count"] == n, name
    specs = [a["spec_decode"] for a in answers]
    assert d[P + "spec_decode_num_draft_tokens_total"] == sum(s["num_draft_tokens"] for s in specs)
    assert d[P + "spec_decode_num_accepted_tokens_total"] == sum(s["num_accepted_drafts"] for s in specs)
    assert p.get(P + "spec_decode_num_draft_tokens_total", 0) == 0


def test_seed_reaches_prefill_and_decode(pd):
    """t0 is sampled on P and the rest on D from the seed the hand-off carries: the same seed gives the same text
    through the router every time, different seeds differ."""
    def text(seed: int) -> str:
        answer = httpx.post(pd.router.url + "/v1/completions", timeout=60,
                            json={"model": "fd-toy", "prompt": "Hello", "max_tokens": 24, "temperature": 1.0,
                                  "seed": seed})
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["text"]

    first = text(77)
    assert text(77) == first and text(77) == first
    assert len({first, text(1), text(2)}) == 3, "different seeds gave equal texts: is the seed used at all?"
    pd.wait_nothing_held()
