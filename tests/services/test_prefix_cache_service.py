"""Prefix caching seen from a client of one API server (docs/serving.md "Prefix caching"): after N identical
requests the hit rates and cached-token counters equal what the workload implies, every response's
`usage.prompt_tokens_details.cached_tokens` matches (completions and chat, streamed usage too), and
`POST /reset_prefix_cache` drops the cached blocks, so the next request misses. The requests go on past their
first token (ignore_eos): with MTP a prompt whose first token stops it caches only its earlier chunks
(PD_MTP_FLOW §13)."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.services import launcher

BLOCK_SIZE = 4
FLAGS = ("--max-num-seqs", "4", "--num-kv-blocks", "96", "--block-size", str(BLOCK_SIZE), "--max-model-len",
         "128", "--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 1}))
P = "fastdeploy:"
PROMPT = [256, *range(40, 70)]          # 31 tokens: 7 full blocks, the 8th holds its last token
CACHED = (len(PROMPT) - 1) // BLOCK_SIZE * BLOCK_SIZE   # every block but the one of the last position


@pytest.fixture(scope="module")
def server():
    with launcher.serving(*FLAGS) as server:
        yield server


def _completion(server, stream: bool = False, **body) -> dict:
    body = {"model": "fd-toy", "prompt": PROMPT, "max_tokens": 4, "ignore_eos": True, **body}
    if not stream:
        answer = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()["usage"]
    usage = None
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[len("data: "):]).get("usage") or usage
    return usage


def test_n_identical_requests_hit_as_the_workload_implies(server):
    requests = 5
    before = server.metrics()
    usages = [_completion(server, stream=i % 2 == 1) for i in range(requests)]
    assert [u["prompt_tokens"] for u in usages] == [len(PROMPT)] * requests
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [0] + [CACHED] * (requests - 1)
    m = server.metrics()
    d = {name: m.get(name, 0) - before.get(name, 0) for name in m}
    assert d[P + "prefix_cache_queries_total"] == requests * len(PROMPT)
    assert d[P + "prefix_cache_hits_total"] == d[P + "prefix_cache_token_num_total"] == (requests - 1) * CACHED
    assert d[P + "prefix_gpu_cache_token_num_total"] == (requests - 1) * CACHED
    # the rates are since the instance started: this module's requests only
    assert m[P + "hit_req_rate"] == pytest.approx((requests - 1) / requests)
    assert m[P + "hit_token_rate"] == m[P + "gpu_hit_token_rate"] == \
        pytest.approx((requests - 1) * CACHED / (requests * len(PROMPT)))
    assert m[P + "prefix_cached_blocks"] == CACHED // BLOCK_SIZE


def test_chat_usage_reports_cached_tokens_and_reset_drops_the_cache(server):
    body = {"model": "fd-toy", "messages": [{"role": "user", "content": "a chat message long enough for blocks"}],
            "max_tokens": 3, "ignore_eos": True}
    first, second = (httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()["usage"]
                     for _ in range(2))
    rendered = first["prompt_tokens"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] == (rendered - 1) // BLOCK_SIZE * BLOCK_SIZE
    cached_blocks = server.metrics()[P + "prefix_cached_blocks"]
    answer = httpx.post(server.url + "/reset_prefix_cache", timeout=30)
    assert answer.status_code == 200 and answer.json() == {"status": "ok", "num_dropped_blocks": cached_blocks}
    assert _completion(server)["prompt_tokens_details"]["cached_tokens"] == 0


def test_cache_salt_keeps_clients_apart(server):
    """vLLM's `cache_salt` is mixed into block 0's key: the same prompt under another salt (or
    none) shares no block, so its `cached_tokens` is 0 and tells its client nothing about the other's prompt;
    the same salt hits."""
    prompt = [256, *range(120, 150)]
    cached = [_completion(server, prompt=prompt, **salt)["prompt_tokens_details"]["cached_tokens"]
              for salt in ({"cache_salt": "tenant-a"}, {"cache_salt": "tenant-b"}, {}, {"cache_salt": "tenant-a"},
                           {"cache_salt": "tenant-b"})]
    assert cached == [0, 0, 0, CACHED, CACHED]
    answer = httpx.post(server.url + "/v1/completions", json={"model": "fd-toy", "prompt": prompt, "cache_salt": ""},
                        timeout=30)
    assert answer.status_code == 400 and "cache_salt" in answer.text


def test_no_report_cached_tokens_reports_zero():
    with launcher.serving(*FLAGS, "--no-report-cached-tokens") as server:
        usages = [_completion(server) for _ in range(2)]
        assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [0, 0]
        assert server.metrics()[P + "prefix_cache_hits_total"] == CACHED   # the cache still works


def test_without_prefix_caching_nothing_is_cached():
    with launcher.serving(*FLAGS, "--no-enable-prefix-caching") as server:
        usages = [_completion(server) for _ in range(2)]
        assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [0, 0]
        m = server.metrics()
        assert m.get(P + "prefix_cache_queries_total", 0) == 0 and m.get(P + "hit_token_rate", 0) == 0
        assert httpx.post(server.url + "/reset_prefix_cache", timeout=30).json()["num_dropped_blocks"] == 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_several_samples_of_one_prompt_report_its_cached_tokens_once(server, stream):
    """A defect the suite once missed: with n > 1 each sample is an engine request that hits the
    cache, but the usage counts the prompt once, so its cached tokens once too (not n times)."""
    _completion(server)                                            # the prompt's blocks are cached now
    usage = _completion(server, stream=stream, n=3, temperature=0.8, seed=7)
    assert usage["prompt_tokens"] == len(PROMPT)
    assert usage["prompt_tokens_details"]["cached_tokens"] == CACHED
    assert usage["completion_tokens"] == 3 * 4
