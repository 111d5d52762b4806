"""Request fields that must reach the engine unchanged through HTTP (SERVICES §3): a `seed` makes sampling at
temperature > 0 repeat exactly (and different seeds differ), and a request whose prompt plus max_tokens is exactly
max_model_len is served to its full length, one token more being refused with 400."""
from __future__ import annotations

import httpx
import pytest

from tests.services import launcher

MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def server():
    with launcher.serving("--max-model-len", str(MAX_MODEL_LEN)) as server:
        yield server


def _text(server, **fields) -> str:
    answer = httpx.post(server.url + "/v1/completions", timeout=60,
                        json={"model": "fd-toy", "prompt": "Hello", "max_tokens": 24, **fields})
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["text"]


def test_seeded_sampling_repeats_and_seeds_differ(server):
    """fd-toy at temperature 1 spreads its choice over many tokens, so 24 sampled tokens differ between seeds; the
    same seed gives the same text every time (streamed or not)."""
    first = _text(server, temperature=1.0, seed=1234)
    assert _text(server, temperature=1.0, seed=1234) == first
    assert _text(server, temperature=1.0, seed=1234, top_p=1.0) == first
    others = {_text(server, temperature=1.0, seed=seed) for seed in (1, 2, 3)}
    assert len(others | {first}) == 4, "different seeds gave equal texts: is the seed used at all?"
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"model": "fd-toy", "prompt": "Hello", "max_tokens": 24, "temperature": 1.0, "seed": 1234,
                            "stream": True}) as answer:
        streamed = "".join(httpx.Response(200, content=line[len("data: "):]).json()["choices"][0]["text"]
                           for line in answer.iter_lines() if line.startswith("data: {"))
    assert streamed == first


def test_prompt_plus_max_tokens_equal_to_max_model_len_is_served(server):
    prompt = [256] + [97] * 19
    room = MAX_MODEL_LEN - len(prompt)
    answer = httpx.post(server.url + "/v1/completions", timeout=60,
                        json={"model": "fd-toy", "prompt": prompt, "max_tokens": room, "min_tokens": room})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == room
    over = httpx.post(server.url + "/v1/completions", timeout=60,
                      json={"model": "fd-toy", "prompt": prompt, "max_tokens": room + 1})
    assert over.status_code == 400 and "max_model_len" in over.json()["error"]["message"]


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "Hello"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
])
def test_no_max_tokens_is_the_rest_of_the_context(server, path, body):
    """vLLM's default (and FastDeploy's chat examples send none): a request without max_tokens may generate up to
    max_model_len - prompt tokens (ignore_eos runs it there), not 16."""
    answer = httpx.post(server.url + path, timeout=120,
                        json={"model": "fd-toy", "ignore_eos": True, "temperature": 0, **body})
    assert answer.status_code == 200, answer.text
    usage, choice = answer.json()["usage"], answer.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert usage["completion_tokens"] == MAX_MODEL_LEN - usage["prompt_tokens"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_sampling_controls_are_accepted_and_change_the_text(server, path):
    """top_k, min_p and the three penalties reach the engine (docs/serving.md, "Sampling controls"); a bad value is
    a 400 naming the field."""
    body = {"model": "fd-toy", "max_tokens": 24}
    body.update({"prompt": "Hello"} if path == "/v1/completions" else {"messages": [{"role": "user",
                                                                                      "content": "Hello"}]})
    pick = (lambda j: j["choices"][0]["text"]) if path == "/v1/completions" else \
        (lambda j: j["choices"][0]["message"]["content"])
    texts = []
    for controls in ({}, {"top_k": 5, "min_p": 0.05, "repetition_penalty": 2.0, "frequency_penalty": 1.5,
                          "presence_penalty": 1.5}):
        answer = httpx.post(server.url + path, timeout=60, json={**body, **controls})
        assert answer.status_code == 200, answer.text
        texts.append(pick(answer.json()))
    assert texts[0] != texts[1]
    for field, value in (("top_k", -5), ("min_p", 2), ("repetition_penalty", 0), ("frequency_penalty", 9),
                         ("presence_penalty", -9)):
        answer = httpx.post(server.url + path, timeout=60, json={**body, field: value})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == field, answer.text
