"""Every counter and gauge of one mixed instance checked by value against what the responses report (SERVICES §4,
docs/serving.md "Metrics"): requests, prompt and generated tokens, finish reasons, refusals, the per-request
histograms, the phase histograms, speculative decoding, and the slot and block gauges, right from the first
/health 200 and while a request holds a slot."""
from __future__ import annotations

import json
import math

import httpx
import pytest

from tests.services import launcher

MAX_NUM_SEQS = 4
NUM_KV_BLOCKS = 128
BLOCK_SIZE = 16
MAX_MODEL_LEN = 1024
FLAGS = ("--max-num-seqs", str(MAX_NUM_SEQS), "--num-kv-blocks", str(NUM_KV_BLOCKS), "--block-size",
         str(BLOCK_SIZE), "--max-model-len", str(MAX_MODEL_LEN), "--speculative-config",
         json.dumps({"method": "mtp", "num_speculative_tokens": 1}))
P = "fastdeploy:"


@pytest.fixture(scope="module")
def server():
    """Started here and read at its very first /health 200 (test_gauges_are_right_at_the_first_health_200)."""
    server = launcher.start(*FLAGS, wait_ready=False)
    try:
        server.wait_until(lambda s: _health(s) == 200, "server ready (/health 200)", launcher.START_TIMEOUT_S)
        server.first_metrics = server.metrics()
        yield server
    finally:
        launcher.stop(server)
        print(f"---- server log ----\n{server.log()[-6000:]}")


def _health(server) -> int | None:
    try:
        return server.health()
    except httpx.HTTPError:
        return None


def _idle_gauges_ok(m: dict) -> None:
    assert m[P + "total_slots"] == MAX_NUM_SEQS and m[P + "free_slots"] == MAX_NUM_SEQS
    assert m[P + "total_kv_blocks"] == NUM_KV_BLOCKS and m[P + "free_kv_blocks"] == NUM_KV_BLOCKS
    assert m[P + "num_requests_running"] == 0 and m[P + "num_requests_waiting"] == 0
    assert m[P + "gpu_cache_usage_perc"] == 0


def test_gauges_are_right_at_the_first_health_200(server):
    """The load gauges hold the engine's figures from the first moment /health says ready (the engine core sends
    its load before its Ready message), not zeros for the first heartbeat interval."""
    _idle_gauges_ok(server.first_metrics)


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": "fd-toy", **body}, timeout=60)


def _stream(server, body: dict) -> dict:
    """A streamed completion, reassembled: its text, finish reason, usage and spec_decode figures."""
    text, last, usage, spec = [], None, None, None
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"model": "fd-toy", "stream": True, "stream_options": {"include_usage": True},
                            **body}) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: "):])
            usage = chunk.get("usage") or usage
            spec = chunk.get("spec_decode") or spec
            for choice in chunk["choices"]:
                text.append(choice["text"])
                last = choice
    return {"choices": [{"text": "".join(text), "finish_reason": last["finish_reason"]}], "usage": usage,
            "spec_decode": spec}


def test_counters_and_histograms_equal_what_the_responses_report(server):
    before = server.metrics()
    free = _post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 12}).json()
    stop = free["choices"][0]["text"][3:5]
    results = [free]
    bodies = [{"prompt": "Hello", "max_tokens": 12, "stop": [stop]},               # finish "stop"
              {"prompt": [256, 72, 105], "max_tokens": 1},                        # one token
              {"prompt": "abc", "max_tokens": 9, "min_tokens": 9}]
    results += [_post(server, "/v1/completions", body).json() for body in bodies]
    results.append(_stream(server, {"prompt": "On Monday", "max_tokens": 7, "min_tokens": 7}))
    chat = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                  "max_tokens": 5}).json()
    results.append(chat)
    # prompt + max_tokens exactly max_model_len is accepted (and runs to its length)
    edge_prompt = [256] + [97] * 9
    edge = _post(server, "/v1/completions", {"prompt": edge_prompt, "max_tokens": MAX_MODEL_LEN - len(edge_prompt),
                                             "min_tokens": MAX_MODEL_LEN - len(edge_prompt)})
    assert edge.status_code == 200, edge.text
    results.append(edge.json())
    assert results[-1]["usage"]["completion_tokens"] == MAX_MODEL_LEN - len(edge_prompt)
    # one token more is refused by the API server before the engine sees it: neither received nor aborted there
    over = _post(server, "/v1/completions", {"prompt": edge_prompt, "max_tokens": MAX_MODEL_LEN - len(edge_prompt) + 1})
    assert over.status_code == 400
    max_tokens = [12] + [b["max_tokens"] for b in bodies] + [7, 5, MAX_MODEL_LEN - len(edge_prompt)]

    m = server.metrics()
    d = {name: m.get(name, 0) - before.get(name, 0) for name in m}
    usages = [r["usage"] for r in results]
    reasons = [r["choices"][0]["finish_reason"] for r in results]
    prompt, completion = sum(u["prompt_tokens"] for u in usages), sum(u["completion_tokens"] for u in usages)
    n = len(results)
    assert reasons.count("stop") >= 1 and reasons.count("length") >= 1
    assert d[P + "requests_number_total"] == n
    assert d[P + "prompt_tokens_total"] == prompt
    # the model also computed the end token the engine writes after the stop string's ids, which no response
    # counts (the request emitted up to the stop string's last token)
    computed = completion + 1
    assert d[P + "generation_tokens_total"] == computed
    assert d[P + "request_success_total{finish_reason=stop}"] == reasons.count("stop")
    assert d[P + "request_success_total{finish_reason=length}"] == reasons.count("length")
    assert d[P + "request_aborted_total"] == 0
    for name, count, total in (("request_prompt_tokens", n, prompt), ("request_generation_tokens", n, computed),
                               ("request_params_max_tokens", n, sum(max_tokens))):
        assert (d[f"{P}{name}_count"], d[f"{P}{name}_sum"]) == (count, total), name
    for name in ("request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
                 "request_inference_time_seconds", "time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert d[f"{P}{name}_count"] == n, name
    assert d[P + "time_per_output_token_seconds_count"] == sum(u["completion_tokens"] > 1 for u in usages)
    # inference (slot to finish) is prefill (slot to first token) plus decode (first token to finish)
    assert math.isclose(d[P + "request_inference_time_seconds_sum"],
                        d[P + "request_prefill_time_seconds_sum"] + d[P + "request_decode_time_seconds_sum"],
                        rel_tol=1e-6, abs_tol=1e-6)
    specs = [r["spec_decode"] for r in results]
    drafts, accepted = sum(s["num_draft_tokens"] for s in specs), sum(s["num_accepted_drafts"] for s in specs)
    assert drafts > 0
    assert d[P + "spec_decode_num_draft_tokens_total"] == drafts
    assert d[P + "spec_decode_num_accepted_tokens_total"] == accepted
    assert d[P + "spec_decode_num_emitted_tokens_total"] == accepted + sum(s["num_decode_rounds"] for s in specs)
    totals = (m[P + "spec_decode_num_accepted_tokens_total"], m[P + "spec_decode_num_draft_tokens_total"])
    assert math.isclose(m[P + "spec_decode_draft_acceptance_rate"], totals[0] / totals[1])
    server.wait_until(lambda s: s.metrics()[P + "num_requests_running"] == 0, "no request running")
    _idle_gauges_ok(server.metrics())


def test_slot_and_block_gauges_while_a_request_runs(server):
    """One long request in flight: one slot taken, some blocks in use (at least the prompt's), usage consistent;
    all back once the client goes away."""
    prompt = [256] + [98] * 40    # 41 tokens: 3 blocks of 16 at least
    # As long as the instance allows, so it is still decoding when /metrics is read (fd-toy decodes 200 tokens
    # in a few hundred ms).
    length = MAX_MODEL_LEN - len(prompt)
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"model": "fd-toy", "prompt": prompt, "max_tokens": length, "min_tokens": length,
                            "stream": True}) as answer:
        lines = answer.iter_lines()
        assert next(lines).startswith("data: {")
        m = server.metrics()
        assert m[P + "num_requests_running"] == 1 and m[P + "free_slots"] == MAX_NUM_SEQS - 1
        used = m[P + "total_kv_blocks"] - m[P + "free_kv_blocks"]
        assert math.ceil(len(prompt) / BLOCK_SIZE) <= used <= math.ceil(MAX_MODEL_LEN / BLOCK_SIZE)
        assert math.isclose(m[P + "gpu_cache_usage_perc"], used / NUM_KV_BLOCKS)
    server.wait_until(lambda s: s.metrics()[P + "num_requests_running"] == 0, "the disconnected request ended")
    _idle_gauges_ok(server.metrics())
