"""Supervision and secrets of a deployment (docs/serving.md "Supervision", "Secrets"): `fastdeploy serve --pd`
restarts a decode instance whose engine core was SIGKILLed under load, the router pairs it again and the deployment
serves within 30 s with nothing held on P; no process it started shows the API key or the PD secret on its command
line, and the engine cores do not even get the API key in their environment."""
from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import httpx
import pytest

from tests.services import launcher

KEY = "sk-test-key-not-for-ps"
PD_SECRET = "pd-secret-not-for-ps"
AUTH = {"Authorization": f"Bearer {KEY}"}
SERVES_AGAIN_WITHIN_S = 30.0
CLIENTS = 3


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children first), from /proc/<pid>/task/*/children."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *descendants(child)]
    return found


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def environ(pid: int) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b"\n").decode(errors="replace")


def assert_no_secret_in_argv(pids: list[int]) -> None:
    for pid in pids:
        line = cmdline(pid)
        assert KEY not in line and PD_SECRET not in line, f"a secret on the command line of {pid}: {line}"


def engine_cores(pids: list[int]) -> list[int]:
    return [pid for pid in pids if "fastdeploy.engine.engine_core" in cmdline(pid)]


def test_mixed_server_keeps_secrets_off_command_lines():
    """The API server gets --api-key here; the engine core it starts has neither the key nor the PD secret on its
    command line, nor the key in its environment (it has no use for it)."""
    server = launcher.start("--api-key", KEY, env={"FD_PD_SECRET": PD_SECRET})
    try:
        pids = descendants(server.process.pid)
        assert len(engine_cores(pids)) == 1, [cmdline(p) for p in pids]
        assert_no_secret_in_argv(pids)
        assert KEY not in environ(engine_cores(pids)[0])
        assert httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=60,
                          json={"model": "fd-toy", "prompt": "Hi", "max_tokens": 2}).status_code == 200
    finally:
        launcher.stop(server)


def _stream_until_error(url: str, outcomes: list) -> None:
    try:
        with httpx.stream("POST", url + "/v1/completions", headers=AUTH, timeout=120,
                          json={"model": "fd-toy", "prompt": "On Monday", "max_tokens": 3000, "min_tokens": 3000,
                                "stream": True}) as answer:
            outcomes.append("".join(answer.iter_lines())[-300:])
    except httpx.HTTPError as error:
        outcomes.append(f"{type(error).__name__}")


def _serves(url: str) -> bool:
    try:
        answer = httpx.post(url + "/v1/completions", headers=AUTH, timeout=30,
                            json={"model": "fd-toy", "prompt": "Hello", "max_tokens": 4})
    except httpx.HTTPError:
        return False
    return answer.status_code == 200


@pytest.fixture()
def serve_pd():
    server = launcher.start("--pd", "--max-model-len", "4096", "--pd-timeout-secs", f"{5 * launcher.load_slowdown():g}",
                            "--api-key", KEY,
                            module="fastdeploy.entrypoints.cli", subcommand="serve", env={"FD_PD_SECRET": PD_SECRET})
    try:
        yield server
    finally:
        children = descendants(server.process.pid) if server.process.poll() is None else []
        status = launcher.stop(server, signal.SIGINT)
        for pid in children:
            if launcher.is_alive(pid):
                os.kill(pid, signal.SIGKILL)
        print(f"---- fastdeploy serve --pd log ----\n{server.log()[-8000:]}")
        assert status == 0, "fastdeploy serve --pd must exit 0 on Ctrl-C"
        assert not [pid for pid in children if launcher.is_alive(pid)], "a child outlived fastdeploy serve --pd"


def test_serve_pd_restarts_decode_after_its_engine_core_is_killed_under_load(serve_pd):
    router = serve_pd
    router.wait_until(lambda s: "ready: PD deployment" in s.log(), "the ready line")
    pids = descendants(router.process.pid)
    assert len(engine_cores(pids)) == 2 and len(pids) == 5, [cmdline(p) for p in pids]
    assert_no_secret_in_argv(pids)
    ready = re.search(r"prefill (http://\S+), decode (http://\S+)\)", router.log())
    prefill_url, decode_url = ready.group(1), ready.group(2)
    decode_api = next(p for p in pids if "--splitwise-role decode" in cmdline(p))
    decode_core = next(p for p in engine_cores(pids) if p in descendants(decode_api))
    for url in (router.url, prefill_url, decode_url):   # the key reached each of them (as FD_API_KEY)
        assert httpx.post(url + "/v1/completions", json={"model": "fd-toy", "prompt": "x"},
                          timeout=30).status_code == 401, url

    outcomes: list = []
    clients = [threading.Thread(target=_stream_until_error, args=(router.url, outcomes), daemon=True)
               for _ in range(CLIENTS)]
    for client in clients:
        client.start()
    decode = launcher.Server(router.process, int(decode_url.rsplit(":", 1)[1]), router.log_path)
    decode.wait_until(lambda s: s.metrics()["fastdeploy:num_requests_running"] == CLIENTS,
                      "the streaming clients running on D", server_alive=False)
    os.kill(decode_core, signal.SIGKILL)
    for client in clients:
        client.join(60)
    assert len(outcomes) == CLIENTS and all('"error"' in o or "Error" in o for o in outcomes), outcomes

    router.wait_until(lambda s: _serves(s.url), "the deployment serving again", SERVES_AGAIN_WITHIN_S)
    prefill = launcher.Server(router.process, int(prefill_url.rsplit(":", 1)[1]), router.log_path)
    prefill.wait_until(launcher.nothing_held, "nothing held on P")
    log = router.log()
    assert "decode instance exited with status 1; restarting" in log and "decode instance restarted" in log
    assert "exiting with status 1" in log
    assert "HTTP Request: POST" not in log, "routine heartbeats must not log at INFO (httpx)"
    new_pids = descendants(router.process.pid)
    assert decode_api not in new_pids and len(engine_cores(new_pids)) == 2
    assert_no_secret_in_argv(new_pids)
