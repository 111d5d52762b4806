"""The router as a process: its command line, signals, API key, and a restart that instances survive by
re-registering (SERVICES §1, §2, §5, §6 router-restart row)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest

from tests.keep_alive import statuses_over_one_idle_connection

from .harness import REPO, FakeGroup, control, events, free_port, registered, start_router, wait_until


def run_launch(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastdeploy.router.launch", *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_help_shows_every_flag_with_its_default():
    """SERVICES §2: the router's flags, each with its default in --help."""
    result = run_launch("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for flag, default in [("--host", "0.0.0.0"), ("--port", "9000"), ("--splitwise", "False"),
                          ("--request-timeout-secs", "600.0"), ("--api-key", "None"),
                          ("--health-interval-secs", "5.0"), ("--timeout-keep-alive", "120.0")]:
        assert flag in text and f"(default: {default})" in text


@pytest.mark.parametrize("flags", [("--port", "0"), ("--health-interval-secs", "-1"),
                                   ("--request-timeout-secs", "0"), ("--timeout-keep-alive", "0"), ("--bogus",),
                                   ("--port", "x")])
def test_bad_flag_exits_2_with_one_line(flags):
    """SERVICES §2: an unknown or invalid flag exits with status 2 and a one-line message."""
    result = run_launch(*flags)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert flags[0] in result.stderr or "unrecognized" in result.stderr


@pytest.fixture(scope="module")
def router_port_and_fake():
    """A fake mixed instance heartbeating to a router port on which the test starts and stops routers."""
    port = free_port()
    group = FakeGroup(port, [("mixed", "hash-a")])
    try:
        group.wait_ready()
        yield port, group.fakes[0]
    finally:
        group.stop()


def test_router_restart_fails_in_flight_and_serves_after_reregistration(router_port_and_fake):
    """SERVICES §6 (router restarts): a request in flight through a killed router fails and is aborted at the
    instance; a new router on the same port serves once the instance's heartbeat re-registers it."""
    port, fake = router_port_and_fake
    first = start_router(port=port)
    try:
        first.wait_ready()
        wait_until(lambda: fake.port in registered(first), "instance registered with the first router")
        control(fake, token_delay=0.1)
        with httpx.Client(base_url=first.url, timeout=30.0) as http:
            with http.stream("POST", "/v1/completions",
                             json={"prompt": "x", "max_tokens": 200, "stream": True}) as answer:
                lines = answer.iter_lines()
                assert next(lines).startswith("data: ")
                first.popen.send_signal(signal.SIGKILL)
                with pytest.raises(httpx.HTTPError):
                    for _ in lines:
                        pass
        wait_until(lambda: events(fake)[-1]["kind"] == "aborted", "instance saw the abort")
    finally:
        control(fake, token_delay=0.0)
        first.stop()
    second = start_router(port=port)
    try:
        second.wait_ready()
        wait_until(lambda: fake.port in registered(second), "instance re-registered")
        answer = httpx.post(second.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10.0)
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["text"] == f"p{fake.port}t0 p{fake.port}t1 "
    finally:
        assert second.stop(signal.SIGINT) == 0, "router must exit 0 on SIGINT (SERVICES §1)"


def test_api_key_guards_openai_routes_only(router_port_and_fake):
    """SERVICES §3: with --api-key, /v1/* need 'Authorization: Bearer <key>' (401 otherwise, OpenAI error);
    the key is forwarded to the instance; /health and /register stay open for probes and heartbeats."""
    port, fake = router_port_and_fake
    router = start_router("--api-key", "sesame", port=port)
    try:
        router.wait_ready()
        wait_until(lambda: fake.port in registered(router), "instance registered")
        body = {"prompt": "x", "max_tokens": 1}
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "sesame"}):
            answer = httpx.post(router.url + "/v1/completions", json=body, headers=headers, timeout=10.0)
            assert answer.status_code == 401
            assert answer.json()["error"]["type"] == "authentication_error"
        assert httpx.get(router.url + "/v1/models", timeout=10.0).status_code == 401
        answer = httpx.post(router.url + "/v1/completions", json=body, timeout=10.0,
                            headers={"authorization": "Bearer sesame"})
        assert answer.status_code == 200
        assert events(fake)[-1]["authorization"] == "Bearer sesame"
        assert httpx.get(router.url + "/health", timeout=10.0).status_code == 200
    finally:
        assert router.stop() == 0


def test_an_idle_keep_alive_connection_still_answers():
    """docs/serving.md "Limits": the router keeps a client's idle connection past the 5 s pool expiry of httpx (the
    OpenAI SDK's) and uvicorn's own default, so a pool never reuses a connection the router is closing."""
    router = start_router()
    try:
        router.wait_ready()
        assert statuses_over_one_idle_connection(router.url, "/registered", {}) == (200, 200)
    finally:
        assert router.stop() == 0


def test_router_package_does_not_import_paddle():
    """SERVICES §1, DESIGN (services): the router never imports Paddle (checked in a fresh interpreter)."""
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
            "import importlib, pkgutil, fastdeploy.router as r\n"
            "for m in pkgutil.iter_modules(r.__path__): importlib.import_module('fastdeploy.router.' + m.name)\n"
            "sys.exit(1 if 'paddle' in sys.modules else 0)\n")
    # -I: no PYTHONPATH / sitecustomize that could import paddle on the router's behalf
    result = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
