"""An instance that is restarting (registered and still counted healthy, but refusing connections): the router
sends the request to another healthy instance, or answers 503 with Retry-After when none is left; never a 502
(docs/design.md "Router"). The health interval is long here, so the refusing instance is still healthy in the
router's eyes when the request comes, as it is in the seconds a restart takes."""
from __future__ import annotations

import httpx
import pytest

from tests.services.launcher import free_port

from .harness import Deployment, registered, start_router

INTERVAL = ("--health-interval-secs", "5")


def register_refusing(router_url: str, role: str, config_hash: str = "hash-a") -> int:
    """Registers an instance at a port nobody listens on; returns the port."""
    port = free_port()
    body = {"role": role, "host": "127.0.0.1", "port": port, "model": "fd-toy", "config_hash": config_hash,
            "connector_addr": None if role == "mixed" else f"127.0.0.1:{free_port()}", "max_num_seqs": 8,
            "version": "test"}
    httpx.post(router_url + "/register", json=body, timeout=10.0).raise_for_status()
    return port


def complete(router_url: str, stream: bool = False) -> httpx.Response:
    return httpx.post(router_url + "/v1/completions", timeout=30.0,
                      json={"model": "fd-toy", "prompt": "x", "max_tokens": 2, "stream": stream})


@pytest.mark.parametrize("mode,roles", [
    ("mixed", [("mixed", "hash-a")]),
    ("splitwise", [("prefill", "hash-a"), ("decode", "hash-a")]),
])
def test_a_refusing_instance_is_skipped_for_a_healthy_one(mode, roles):
    flags = INTERVAL + (("--splitwise",) if mode == "splitwise" else ())
    deployment = Deployment(flags, roles)
    try:
        url = deployment.router.url
        assert complete(url).status_code == 200        # the live instances have been used once
        for role, _ in roles:                           # a refusing one, less used, is the router's first choice
            port = register_refusing(url, role)
            for stream in (False, True):
                answer = complete(url, stream)
                assert answer.status_code == 200, answer.text
            row = registered(deployment.router)[port]
            assert row["assigned"] == 1 and not row["healthy"], row
    finally:
        deployment.stop()


@pytest.mark.parametrize("mode", ["mixed", "splitwise"])
def test_with_only_refusing_instances_the_answer_is_503_with_retry_after(mode):
    router = start_router(*INTERVAL, *(("--splitwise",) if mode == "splitwise" else ()))
    try:
        router.wait_ready()
        for role in (("mixed",) if mode == "mixed" else ("prefill", "decode")):
            register_refusing(router.url, role)
        answer = complete(router.url)
        assert answer.status_code == 503, answer.text
        assert answer.headers["retry-after"] == "10"         # two health checks 5 s apart
        assert answer.json()["error"]["code"] == 503
    finally:
        router.stop()
