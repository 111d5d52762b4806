"""sglang-router's cache-aware policy over two mixed instances (docs/serving.md "Behind sglang-router", the
cache-aware recipe): requests that share a long system prompt go to the instance that already holds its KV, so
every request after the first of its system prompt hits the prefix cache for the whole shared part, and each
instance's hit counter equals the cached tokens its responses report. Round robin, the contrast, sends the second
request of a system prompt (they come in a row) to the other instance, which has not seen it."""
from __future__ import annotations

import httpx
import pytest

from tests.services import launcher

pytest.importorskip("sglang_router", reason="sglang-router is not installed (pip install -e \".[router]\")")

BLOCK_SIZE = 16
FLAGS = ("--block-size", str(BLOCK_SIZE), "--max-model-len", "512", "--drain-timeout-s", "2")
SYSTEM = ["You are a terse assistant for a shipping company. Answer with one short sentence about parcels. " * 2,
          "Zebras graze on the savanna while a ranger counts them and writes numbers into a small notebook. " * 2]
USERS = ["Where is my parcel?", "How heavy can it be?", "Do you ship abroad?"]
P = "fastdeploy:"


def _start_router(workers: list[launcher.Server], policy: str, log_dir) -> launcher.Server:
    return launcher.start("--worker-urls", *(w.url for w in workers), "--policy", policy,
                          "--prometheus-host", "127.0.0.1", "--prometheus-port", str(launcher.free_port()),
                          "--worker-startup-check-interval", "1", "--log-level", "warn",
                          model=None, module="sglang_router.launch_router", wait_ready=False, log_dir=log_dir)


def _healthy_workers(router: launcher.Server) -> int:
    try:
        return sum(row["is_healthy"] for row in httpx.get(router.url + "/workers", timeout=5).json()["workers"])
    except (httpx.HTTPError, ValueError, KeyError):
        return 0


def _cached_tokens_per_request(policy: str, log_dir) -> tuple[list[list[int]], list[dict]]:
    """For each system prompt, the cached tokens of its requests in order, sent one at a time; and each
    instance's metrics afterwards."""
    with launcher.serving(*FLAGS, log_dir=log_dir) as first, launcher.serving(*FLAGS, log_dir=log_dir) as second:
        router = _start_router([first, second], policy, log_dir)
        try:
            router.wait_until(lambda r: _healthy_workers(r) == 2, "sglang-router lists both workers", 60)
            cached: list[list[int]] = [[] for _ in SYSTEM]
            for i, system in enumerate(SYSTEM):     # a system prompt's requests in a row
                for user in USERS:
                    answer = httpx.post(router.url + "/v1/completions", timeout=60,
                                        json={"model": "fd-toy", "prompt": system + user, "max_tokens": 4,
                                              "ignore_eos": True})
                    assert answer.status_code == 200, answer.text
                    cached[i].append(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
            return cached, [first.metrics(), second.metrics()]
        finally:
            launcher.stop(router)


def test_cache_aware_routing_sends_a_shared_system_prompt_where_its_kv_is(tmp_path):
    cached, metrics = _cached_tokens_per_request("cache_aware", tmp_path)
    for system, hits in zip(SYSTEM, cached):
        shared_blocks = (1 + len(system)) // BLOCK_SIZE            # BOS + the system prompt, byte tokens
        assert hits[0] == 0 and all(h >= shared_blocks * BLOCK_SIZE for h in hits[1:]), hits
    assert sum(m[P + "prefix_cache_hits_total"] for m in metrics) == sum(map(sum, cached))


def test_round_robin_misses_what_cache_aware_hits(tmp_path):
    cached, _ = _cached_tokens_per_request("round_robin", tmp_path)
    assert any(h == 0 for hits in cached for h in hits[1:]), cached
