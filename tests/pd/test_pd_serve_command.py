"""`fastdeploy serve --pd` (SERVICES §2, README "PD as services"): router + P + D on free loopback ports, a ready
line with the router's URL, greedy output equal to the in-process LLM through that URL, and Ctrl-C stops all
three with exit status 0, leaving no process behind."""
from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from tests.services.launcher import free_port

REPO = Path(__file__).resolve().parents[2]
READY_WITHIN_S = 180.0     # bounds that turn a hang into a failure; never assertions on time
STOP_WITHIN_S = 60.0


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill_all(proc: subprocess.Popen, children: list[int]) -> None:
    """Whatever a failed test left running: the supervisor and any child that outlived it."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in children:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _ready_line(proc: subprocess.Popen) -> str:
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    give_up = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < give_up and proc.poll() is None:
        if selector.select(timeout=1.0):
            line = proc.stdout.readline()
            if line.startswith("ready:"):
                return line
    raise AssertionError(f"no ready line (exit status {proc.poll()})")


# (model, flags): the README's command on fd-toy, on fd-tiny with the KV moved by Mooncake over TCP, and both with
# async scheduling (docs/design.md §10: the same text)
SERVE_CASES = [("fd-toy", ()), ("fd-tiny", ("--cache-transfer-protocol", "mooncake-tcp")),
               ("fd-toy", ("--async-scheduling",)),
               ("fd-tiny", ("--cache-transfer-protocol", "mooncake-tcp", "--async-scheduling"))]


@pytest.mark.parametrize("model,transfer", SERVE_CASES, ids=["fd-toy-zmq", "fd-tiny-mooncake-tcp", "fd-toy-zmq-async",
                                                             "fd-tiny-mooncake-tcp-async"])
def test_serve_pd_starts_three_processes_serves_and_stops_them_all(model, transfer):
    if "mooncake-tcp" in transfer and (reason := mooncake_unavailable_reason()) is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fastdeploy.entrypoints.cli", "serve", "--pd", "--model", model,
                             "--mtp", "1", "--port", str(port), *transfer], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, text=True)
    children = []
    try:
        line = _ready_line(proc)
        url = line.split(" at ", 1)[1].split(" ", 1)[0]
        assert url == f"http://127.0.0.1:{port}/v1", "the router listens on --port"
        children = _children(proc.pid)
        assert len(children) == 3, f"router, P and D expected, found {children}"
        answer = httpx.post(f"{url}/completions", timeout=60, json={
            "model": model, "prompt": "hello world", "max_tokens": 12, "temperature": 0}).json()
        expected = LLM(model=model, speculative_config={"method": "mtp", "num_speculative_tokens": 1}).generate(
            "hello world", SamplingParams(max_tokens=12), use_tqdm=False)[0]
        assert answer["choices"][0]["text"] == expected.outputs.text
        # D's prefix cache across the processes (PD_MTP_FLOW §13.6): the second time D holds the prompt's blocks,
        # P sends only the rest, and the text is the same
        long_prompt = {"model": model, "prompt": "hello world, " * 24, "max_tokens": 12, "temperature": 0}
        first, again = (httpx.post(f"{url}/completions", timeout=60, json=long_prompt).json() for _ in range(2))
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, again["usage"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(STOP_WITHIN_S) == 0
        assert not [pid for pid in children if _alive(pid)], "a child outlived `fastdeploy serve --pd`"
    finally:
        _kill_all(proc, children)


@pytest.mark.timeout(400)
def test_serve_pd_with_one_prefill_and_two_decode_instances_serves_through_every_one():
    """`--num-prefill 1 --num-decode 2`: four children (router, P, two D), a ready line naming every instance's
    URL, the in-process LLM's greedy text through the router, and both D serving (the router's counts and each
    D's own /metrics); Ctrl-C stops all four, exit status 0."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fastdeploy.entrypoints.cli", "serve", "--pd", "--model", "fd-toy",
                             "--mtp", "1", "--port", str(port), "--num-prefill", "1", "--num-decode", "2",
                             "--decode-max-num-seqs", "4"], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    children = []
    try:
        line = _ready_line(proc)
        listed = dict(re.findall(r"(prefill|decode \d) (http://127\.0\.0\.1:\d+)", line))
        assert sorted(listed) == ["decode 0", "decode 1", "prefill"], line
        children = _children(proc.pid)
        assert len(children) == 4, f"router, P and two D expected, found {children}"
        prompts = ["hello world", "On Monday, Judy", "The cat sat", "abc"]
        expected = LLM(model="fd-toy", speculative_config={"method": "mtp", "num_speculative_tokens": 1}).generate(
            prompts, SamplingParams(max_tokens=12), use_tqdm=False)
        for prompt, want in zip(prompts, expected):
            answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60, json={
                "model": "fd-toy", "prompt": prompt, "max_tokens": 12, "temperature": 0}).json()
            assert answer["choices"][0]["text"] == want.outputs.text, prompt
        rows = httpx.get(f"http://127.0.0.1:{port}/registered", timeout=10).json()["instances"]
        assert sorted(row["role"] for row in rows) == ["decode", "decode", "prefill"]
        assert all(row["assigned"] >= 1 and row["max_num_seqs"] == (4 if row["role"] == "decode" else 8)
                   for row in rows), rows
        for name in ("decode 0", "decode 1"):
            metrics = httpx.get(f"{listed[name]}/metrics", timeout=10).text
            assert re.search(r"^fastdeploy:requests_number_total [1-9]", metrics, re.M), name
        proc.send_signal(signal.SIGINT)
        assert proc.wait(STOP_WITHIN_S) == 0
        assert not [pid for pid in children if _alive(pid)], "a child outlived `fastdeploy serve --pd`"
    finally:
        _kill_all(proc, children)


@pytest.mark.parametrize("flags, message", [
    (("--pd", "--num-decode", "0"), "--num-decode must be >= 1"),
    (("--pd", "--num-prefill", "-1"), "--num-prefill must be >= 1"),
    (("--num-decode", "2"), "--num-decode needs --pd")])
def test_instance_counts_are_checked(flags, message):
    result = subprocess.run([sys.executable, "-m", "fastdeploy.entrypoints.cli", "serve", *flags], cwd=REPO,
                            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_serve_pd_refuses_a_role_or_router_of_its_own():
    """--pd starts its own router and roles: asking for another is a one-line error, status 2."""
    result = subprocess.run([sys.executable, "-m", "fastdeploy.entrypoints.cli", "serve", "--pd",
                             "--splitwise-role", "prefill"], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2 and "--pd starts its own router" in result.stderr


def _role_argv(*flags: str) -> dict[str, list[str]]:
    from fastdeploy.entrypoints.cli import build_parser
    from fastdeploy.entrypoints.pd_serve import _instance_argv

    args = build_parser().parse_args(["serve", "--pd", "--model", "fd-toy", *flags])
    return {role: _instance_argv(args, role, 9000, 9001) for role in ("prefill", "decode")}


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_the_decode_instance_gets_twice_the_slots_unless_told_otherwise():
    """docs/design.md §8: D computes no prompt, so `serve --pd` gives it the slots of the two mixed instances it
    stands in for (2 x --max-num-seqs); --decode-max-num-seqs overrides that, P keeps --max-num-seqs."""
    argv = _role_argv("--max-num-seqs", "6")
    assert (_flag(argv["prefill"], "--max-num-seqs"), _flag(argv["decode"], "--max-num-seqs")) == ("6", "12")
    argv = _role_argv("--max-num-seqs", "6", "--decode-max-num-seqs", "20")
    assert (_flag(argv["prefill"], "--max-num-seqs"), _flag(argv["decode"], "--max-num-seqs")) == ("6", "20")


def test_the_transfer_protocol_reaches_both_instances():
    argv = _role_argv("--cache-transfer-protocol", "mooncake-tcp")
    assert [_flag(argv[role], "--cache-transfer-protocol") for role in argv] == ["mooncake-tcp"] * 2
    assert all("--mooncake-device" not in a for a in argv.values())


def test_the_staging_slots_reach_prefill_only():
    argv = _role_argv("--cache-transfer-protocol", "mooncake-tcp", "--mooncake-staging-slots", "1")
    assert (_flag(argv["prefill"], "--mooncake-staging-slots"), _flag(argv["decode"], "--mooncake-staging-slots")) \
        == ("1", None)


def test_the_prefix_caching_flag_reaches_both_instances_and_the_engine_config():
    """On by default; --no-enable-prefix-caching turns it off on P and D; the API server's flags give FDConfig the
    same value; the PD compatibility hash does not depend on it (P and D may differ)."""
    from fastdeploy.engine.connector.base import instance_config_hash
    from fastdeploy.entrypoints.openai.serve_args import build_parser, config_from_args

    assert all("--enable-prefix-caching" in a for a in _role_argv().values())
    argv = _role_argv("--no-enable-prefix-caching")
    assert all("--no-enable-prefix-caching" in a and "--enable-prefix-caching" not in a for a in argv.values())
    on = config_from_args(build_parser().parse_args(["--model", "fd-toy"]))
    off = config_from_args(build_parser().parse_args(["--model", "fd-toy", "--no-enable-prefix-caching"]))
    assert (on.enable_prefix_caching, off.enable_prefix_caching) == (True, False)
    assert instance_config_hash(on, 259) == instance_config_hash(off, 259)
