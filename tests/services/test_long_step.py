"""A long step is not a dead engine (SERVICES §6 liveness, docs/design.md §7 "Liveness"): the engine core's heartbeat
comes from a thread of its own, so a model pass that sleeps three times --heartbeat-timeout-s still completes its
request and nothing restarts; a step is declared hung only past --step-timeout-s, when the operator sets one. (A
core that is silent as a whole, SIGSTOP, is still killed: test_api_faults.py.)"""
from __future__ import annotations

import httpx

from tests.services import launcher
from tests.services.slow_pass import PASS_S_ENV

SLOW = "tests.services.slow_pass"
# The heartbeat timeout scales with the load (a starved heartbeat thread is not the point here), and a pass
# sleeps three times it, so every step outlasts it whatever the load.
HEARTBEAT_TIMEOUT_S = 2.0 * launcher.load_slowdown()
PASS_S = 3 * HEARTBEAT_TIMEOUT_S
SLOW_ENV = {PASS_S_ENV: str(PASS_S)}
EXIT_BOUND_S = 60.0 + 3 * PASS_S   # only turns a hang into a failure


def _completion(server: launcher.Server, max_tokens: int) -> httpx.Response:
    body = {"model": "fd-toy", "prompt": "Hello", "max_tokens": max_tokens, "min_tokens": max_tokens}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=10 * PASS_S * max_tokens)


def test_a_pass_longer_than_the_heartbeat_timeout_completes_and_nothing_restarts():
    """Every pass sleeps PASS_S, three times --heartbeat-timeout-s: a two-token request (two passes) answers 200
    with both tokens, the engine core is the same live process before and after, /health is 200, and the log
    names the long step as busy (so the step did outlast the timeout) and never a lost core."""
    server = launcher.start("--heartbeat-timeout-s", str(HEARTBEAT_TIMEOUT_S), module=SLOW, env=SLOW_ENV)
    try:
        core = server.engine_core_pid()
        answer = _completion(server, 2)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 2
        assert server.process.poll() is None and server.engine_core_pid() == core and launcher.is_alive(core)
        assert server.health() == 200
    finally:
        status = launcher.stop(server)
    log = server.log()
    assert status == 0, log[-3000:]
    assert "engine core lost" not in log and "engine core busy" in log, log[-3000:]


def test_a_step_past_the_step_timeout_is_declared_hung_and_the_server_exits_1():
    """With --step-timeout-s set below one pass, the step that outlasts it is hung: the request fails with a 503
    naming the bound, the core is killed and the API server exits 1 (for its supervisor), as for any dead core."""
    server = launcher.start("--heartbeat-timeout-s", str(HEARTBEAT_TIMEOUT_S), "--step-timeout-s",
                            str(HEARTBEAT_TIMEOUT_S), module=SLOW, env=SLOW_ENV)
    core = server.engine_core_pid()
    try:
        answer = _completion(server, 1)
        assert answer.status_code == 503 and "--step-timeout-s" in answer.json()["error"]["message"], answer.text
        server.wait_until(lambda s: s.process.poll() is not None, "the API server exited", EXIT_BOUND_S,
                          server_alive=False)
        server.wait_until(lambda s: not launcher.is_alive(core), "the hung engine core killed", EXIT_BOUND_S,
                          server_alive=False)
    finally:
        launcher.stop(server)
    assert server.process.returncode == 1, server.log()[-3000:]
