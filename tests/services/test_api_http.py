"""The HTTP surface of one mixed instance (SERVICES §3, §4, §8 "Bad input"): every bad request gets the documented
4xx as an OpenAI error object naming the field, and the server keeps serving; auth, body limit, concurrency limit,
client disconnects and the metric names."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from openai import OpenAI

from fastdeploy import LLM, SamplingParams
from tests.keep_alive import statuses_over_one_idle_connection
from tests.services import launcher

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_CONCURRENCY = 3
MAX_BODY = 4096
MAX_MODEL_LEN = 4096   # long requests (seconds) stay in flight while the test acts on them
LONG = {"max_tokens": 4000, "min_tokens": 4000}


@pytest.fixture(scope="module")
def server():
    with launcher.serving("--api-key", KEY, "--max-concurrency", str(MAX_CONCURRENCY), "--max-body-bytes",
                          str(MAX_BODY), "--max-model-len", str(MAX_MODEL_LEN), "--speculative-config",
                          '{"method": "mtp"}') as server:
        yield server


def _post(server, path: str, body, headers=AUTH) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, headers={"content-type": "application/json", **headers},
                      timeout=30)


def _completion(**fields) -> dict:
    return {"model": "fd-toy", "prompt": "Hello", "max_tokens": 4, **fields}


def _chat(**fields) -> dict:
    return {"model": "fd-toy", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **fields}


# (case, path, body, status, param named in the error); a None param means "no single field"
BAD_INPUT = [
    ("malformed_json", "/v1/completions", "{not json", 400, None),
    ("body_not_object", "/v1/completions", "[1, 2]", 400, None),
    ("missing_prompt", "/v1/completions", {"model": "fd-toy"}, 400, "prompt"),
    ("unknown_field", "/v1/completions", _completion(colour="blue"), 400, "colour"),
    ("max_tokens_string", "/v1/completions", _completion(max_tokens="5"), 400, "max_tokens"),
    ("prompt_number", "/v1/completions", _completion(prompt=5), 400, "prompt"),
    ("prompt_list_of_mixed", "/v1/completions", _completion(prompt=["a", 5]), 400, "prompt[1]"),
    ("max_tokens_zero", "/v1/completions", _completion(max_tokens=0), 400, "max_tokens"),
    ("temperature_negative", "/v1/completions", _completion(temperature=-1), 400, "temperature"),
    ("top_p_zero", "/v1/completions", _completion(top_p=0), 400, "top_p"),
    ("top_p_above_one", "/v1/completions", _completion(top_p=1.5), 400, "top_p"),
    ("seed_negative", "/v1/completions", _completion(seed=-1), 400, "seed"),
    ("min_tokens_above_max", "/v1/completions", _completion(min_tokens=9), 400, "min_tokens"),
    ("stream_not_bool", "/v1/completions", _completion(stream="yes"), 400, "stream"),
    ("n_zero", "/v1/completions", _completion(n=0), 400, "n"),
    ("logprobs_over_5", "/v1/completions", _completion(logprobs=6), 400, "logprobs"),
    ("best_of", "/v1/completions", _completion(best_of=2), 400, "best_of"),
    ("echo", "/v1/completions", _completion(echo=True), 400, "echo"),
    ("presence_penalty", "/v1/completions", _completion(presence_penalty=2.5), 400, "presence_penalty"),
    ("top_k_below_minus_one", "/v1/completions", _completion(top_k=-2), 400, "top_k"),
    ("repetition_penalty_zero", "/v1/completions", _completion(repetition_penalty=0), 400, "repetition_penalty"),
    ("logit_bias", "/v1/completions", _completion(logit_bias={"1": 2}), 400, "logit_bias"),
    ("empty_prompt", "/v1/completions", _completion(prompt=""), 400, "prompt"),
    ("whitespace_prompt", "/v1/completions", _completion(prompt=" \n\t "), 400, "prompt"),
    ("empty_token_list", "/v1/completions", _completion(prompt=[]), 400, "prompt"),
    ("token_id_out_of_vocab", "/v1/completions", _completion(prompt=[256, 999999]), 400, "prompt[1]"),
    ("longer_than_max_model_len", "/v1/completions", _completion(max_tokens=MAX_MODEL_LEN), 400, "max_tokens"),
    ("too_many_stop_strings", "/v1/completions", _completion(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("stop_string_too_long", "/v1/completions", _completion(stop=["x" * 17]), 400, "stop"),
    ("empty_stop_string", "/v1/completions", _completion(stop=[""]), 400, "stop"),
    ("unknown_model", "/v1/completions", _completion(model="gpt-4"), 404, "model"),
    ("chat_no_messages", "/v1/chat/completions", _chat(messages=[]), 400, "messages"),
    ("chat_bad_role", "/v1/chat/completions", _chat(messages=[{"role": "robot", "content": "x"}]), 400,
     "messages[0].role"),
    ("chat_missing_content", "/v1/chat/completions", _chat(messages=[{"role": "user"}]), 400,
     "messages[0].content"),
    ("chat_whitespace_user", "/v1/chat/completions", _chat(messages=[{"role": "user", "content": "  "}]), 400,
     "messages"),
    ("chat_both_token_limits", "/v1/chat/completions", _chat(max_completion_tokens=3), 400, "max_tokens"),
    ("body_too_large", "/v1/completions", _completion(prompt="x" * MAX_BODY), 413, None),
]


@pytest.mark.parametrize("case,path,body,status,param", BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_gets_documented_4xx_naming_the_field(server, case, path, body, status, param):
    """SERVICES §3 errors / SERVICES §8 bad input: status, OpenAI error object, the field named; never a 500."""
    response = _post(server, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert error["param"] == param, error
    if param is not None:
        assert param in error["message"]


def test_server_keeps_serving_after_bad_input(server):
    """After the bad-input table the same server answers a valid request and is healthy."""
    for _, path, body, _, _ in BAD_INPUT[:5]:
        _post(server, path, body)
    assert _post(server, "/v1/completions", _completion()).status_code == 200
    assert server.health() == 200


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}],
                         ids=["missing", "wrong", "not_bearer"])
def test_api_key_required_on_v1_routes(server, headers):
    """--api-key: /v1/* and /reset_prefix_cache without `Authorization: Bearer <key>` are 401; /health, /ping,
    /metrics stay open."""
    assert _post(server, "/v1/completions", _completion(), headers=headers).status_code == 401
    assert httpx.get(server.url + "/v1/models", headers=headers).status_code == 401
    for path in ("/health", "/ping", "/metrics"):
        assert httpx.get(server.url + path).status_code == 200
    # the admin route too (anyone reaching the port could flush every tenant's cache)
    assert httpx.post(server.url + "/reset_prefix_cache", headers=headers).status_code == 401
    assert httpx.post(server.url + "/reset_prefix_cache", headers=AUTH).json()["status"] == "ok"


def test_unknown_route_and_method_are_openai_errors(server):
    """Unknown routes are 404 and wrong methods 405, both as OpenAI error objects."""
    missing = httpx.get(server.url + "/v1/nothing", headers=AUTH)
    wrong_method = httpx.get(server.url + "/v1/completions", headers=AUTH)
    assert (missing.status_code, wrong_method.status_code) == (404, 405)
    assert missing.json()["error"]["code"] == 404 and wrong_method.json()["error"]["code"] == 405


def test_models_lists_the_served_model(server):
    client = OpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["fd-toy"]


def test_chat_completion_equals_llm_on_rendered_template(server):
    """/v1/chat/completions renders the documented chat template (docs/serving.md); streamed and not, the text
    equals the in-process LLM on that prompt."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    prompt = "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n"   # the documented template, by hand
    want = LLM(model="fd-toy", speculative_config={"method": "mtp"}).generate(
        prompt, SamplingParams(max_tokens=12), use_tqdm=False)[0].outputs.text
    client = OpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=0, timeout=60)
    got = client.chat.completions.create(model="fd-toy", messages=messages, max_tokens=12, temperature=0)
    assert (got.choices[0].message.role, got.choices[0].message.content) == ("assistant", want)
    stream = client.chat.completions.create(model="fd-toy", messages=messages, max_tokens=12, temperature=0,
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == want


def test_concurrency_limit_429_and_disconnects_free_everything(server):
    """--max-concurrency N: request N + 1 gets 429. Closing the N streams mid-way (client disconnect) aborts
    them: /metrics shows every slot and block free again and N aborted requests (SERVICES §3, §8 faults)."""
    aborted_before = server.metrics().get("fastdeploy:request_aborted_total", 0)

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=30) as client:
            async with contextlib_streams(client, MAX_CONCURRENCY) as streams:
                # keep each line iterator alive: dropping one closes its stream (a disconnect)
                lines = [stream.aiter_lines() for stream in streams]
                for stream, line_iter in zip(streams, lines):
                    assert stream.status_code == 200
                    assert (await anext(line_iter)).startswith("data: {")   # the request is running
                assert (await client.get("/health")).status_code == 200   # answers while the engine is busy
                over = await client.post("/v1/completions", json=_completion())
                assert over.status_code == 429 and over.json()["error"]["code"] == 429

    completed_before = _completed(server.metrics())
    asyncio.run(scenario())
    server.wait_until(lambda s: s.metrics()["fastdeploy:request_aborted_total"] + _completed(s.metrics())
                      >= aborted_before + completed_before + MAX_CONCURRENCY, "the disconnected requests ended")
    m = server.metrics()
    assert (m["fastdeploy:request_aborted_total"], _completed(m)) == (aborted_before + MAX_CONCURRENCY,
                                                                      completed_before)
    server.wait_until(launcher.nothing_held, "all slots and blocks free after the disconnects")
    assert _post(server, "/v1/completions", _completion()).status_code == 200


def test_non_streaming_client_disconnect_aborts_the_request(server):
    """A non-streaming client that goes away while its request runs: the request is aborted and frees its slot
    and blocks (SERVICES §3)."""
    aborted_before = server.metrics().get("fastdeploy:request_aborted_total", 0)

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=30) as client:
            # 1500 tokens: seconds of work, long enough to leave mid-way, short enough that a request left running
            # ends (and fails the test below) well within a minute
            task = asyncio.create_task(client.post("/v1/completions", json=_completion(max_tokens=1500,
                                                                                       min_tokens=1500)))
            for _ in range(1500):   # bounded wait (30 s) for the request to hold a slot
                if server.metrics()["fastdeploy:num_requests_running"] >= 1:
                    break
                await asyncio.sleep(0.02)
            assert not task.done(), "the long request ended before the client left"
            task.cancel()   # closes the connection
            with pytest.raises(asyncio.CancelledError):
                await task

    completed_before = _completed(server.metrics())
    asyncio.run(scenario())
    # Wait for the request to end either way, then require the abort: a request left running to its natural end
    # fails here as soon as it ends, not at the wait's bound.
    server.wait_until(lambda s: _ended(s.metrics(), aborted_before, completed_before),
                      "the disconnected request ended")
    m = server.metrics()
    assert (m["fastdeploy:request_aborted_total"], _completed(m)) == (aborted_before + 1, completed_before)
    server.wait_until(launcher.nothing_held, "slot and blocks free after the disconnect")


def _completed(m: dict) -> float:
    return sum(v for name, v in m.items() if name.startswith("fastdeploy:request_success_total"))


def _ended(m: dict, aborted_before: float, completed_before: float) -> bool:
    return m.get("fastdeploy:request_aborted_total", 0) > aborted_before or _completed(m) > completed_before


def test_metrics_export_fastdeploy_names(server):
    """SERVICES §4: FastDeploy's metric names, spec-decode counters included, fed by a completed request."""
    assert _post(server, "/v1/completions", _completion(max_tokens=8)).status_code == 200
    m = server.metrics()
    for name in ("num_requests_running", "num_requests_waiting", "gpu_cache_usage_perc", "free_kv_blocks",
                 "total_kv_blocks", "free_slots", "total_slots", "time_to_first_token_seconds_count",
                 "time_per_output_token_seconds_count", "e2e_request_latency_seconds_count", "prompt_tokens_total",
                 "generation_tokens_total", "spec_decode_draft_acceptance_rate",
                 "spec_decode_num_accepted_tokens_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_emitted_tokens_total"):
        assert f"fastdeploy:{name}" in m, name
    assert m["fastdeploy:request_success_total{finish_reason=length}"] >= 1
    assert m["fastdeploy:spec_decode_num_draft_tokens_total"] > 0
    assert 0 <= m["fastdeploy:spec_decode_draft_acceptance_rate"] <= 1


class contextlib_streams:
    """Open `n` long streaming completions at once; leaving the block closes them (the client disconnects)."""

    def __init__(self, client: httpx.AsyncClient, n: int):
        self.client, self.n = client, n

    async def __aenter__(self):
        self._contexts = [self.client.stream("POST", "/v1/completions", json=_completion(stream=True, **LONG))
                          for _ in range(self.n)]
        return [await c.__aenter__() for c in self._contexts]

    async def __aexit__(self, *exc):
        for c in self._contexts:
            await c.__aexit__(None, None, None)


def test_include_stop_str_in_output_keeps_the_stop_string(server):
    """SERVICES §3 / vLLM's extension: by default the text ends before the stop string; with
    include_stop_str_in_output it ends with it; both finish "stop"."""
    free = _post(server, "/v1/completions", _completion(max_tokens=12)).json()["choices"][0]["text"]
    stop = free[2:4]
    cut = _post(server, "/v1/completions", _completion(max_tokens=12, stop=stop)).json()["choices"][0]
    kept = _post(server, "/v1/completions", _completion(max_tokens=12, stop=[stop],
                                                        include_stop_str_in_output=True)).json()["choices"][0]
    head = free[:free.index(stop)]
    assert (cut["text"], cut["finish_reason"]) == (head, "stop")
    assert (kept["text"], kept["finish_reason"]) == (head + stop, "stop")


@pytest.mark.parametrize("stop,message", [
    (["a", "b", "c", "d", "e"], "'stop' allows at most 4 sequences, got 5"),
    (["ok", "x" * 17], "'stop' sequences must be 1..16 tokens long; stop[1] is 17 tokens")],
    ids=["count", "length"])
def test_a_stop_list_the_engine_cannot_hold_is_named_by_count_or_by_its_entry(server, stop, message):
    """Noise: the refusal gives the number of stop strings, or the one that is too long, not a list of
    token lengths."""
    response = _post(server, "/v1/completions", _completion(stop=stop))
    assert response.status_code == 400 and response.json()["error"]["message"] == message, response.text


def test_an_idle_keep_alive_connection_still_answers(server):
    """docs/serving.md "Limits": a client's connection idle past 5 s (uvicorn's own default, and the pool expiry of
    httpx, the OpenAI SDK's) still answers, so a pool never reuses a connection the server is closing."""
    assert statuses_over_one_idle_connection(server.url, "/v1/models", AUTH) == (200, 200)
