"""The flood battery's stranger and dead-P cases against a real router, P and D with a PD secret (SERVICES §6-§7,
docs/design.md §8 "Who may deliver frames" and "A P that never answers holds no slot").

- Strangers: STRANGERS connections at P's connector port and a "P" that a client names to D each send one
  multipart message that never ends (STRANGER_BYTES each, tests/splitwise/zmtp_stranger.py). Nobody holding the
  secret, none completes the handshake: P's and D's engine cores grow by less than RSS_BOUND_MIB (before, about a
  MiB per MiB sent), and requests through the router are served the greedy text during and after.
- Dead P's: POISONED requests sent straight to D (16 slots), paired with a P address where nothing listens. While
  they wait, D gives them no slot (its free-slot gauge stays at its total) and requests through the router are
  served; they all fail (4xx/5xx), and D holds nothing afterwards. benchmarks/pd_flood_ttft.py measures the good
  requests' latency meanwhile; no assertion here is on time."""
from __future__ import annotations

import socket
import threading

import pytest

from fastdeploy import LLM, SamplingParams
from tests.services import deployment as deploy
from tests.services.flood import Flood, connector_addr, rss_mib
from tests.splitwise.zmtp_stranger import FakeP, flood, open_to

PROMPT = "On Monday, Judy"
SECRET = "flood-strangers-secret"
STRANGERS = 3
STRANGER_BYTES = 96 << 20
RSS_BOUND_MIB = 64     # generous: the handshakes' state is KiB; a served request or two adds a few MiB
POISONED = 64
HEALTH = ("--health-interval-secs", "2")   # as test_flood.py: a starved API server is not dropped on two cores
FLAGS = ("--pd-timeout-secs", "10", *HEALTH)
SLOTS = 16
# a long connection deadline: on a loaded machine the poisoned requests must still be waiting when they are counted
D_FLAGS = (*FLAGS, "--max-num-seqs", str(SLOTS), "--pd-reservation-ack-timeout-secs", "10")


@pytest.fixture(scope="module")
def greedy() -> str:
    return LLM(model="fd-toy").generate([PROMPT], SamplingParams(max_tokens=8), use_tqdm=False)[0].outputs.text


@pytest.fixture
def deployment(tmp_path):
    flags = deploy.secret_flags(tmp_path, SECRET)
    running = deploy.pd_deployment(prefill_flags=(*FLAGS, *flags), decode_flags=(*D_FLAGS, *flags),
                                   router_flags=HEALTH)
    yield running
    running.stop()


def _serve(deployment: deploy.Deployment, greedy: str, times: int = 1) -> None:
    with deployment.client() as client:
        for _ in range(times):
            assert client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=8).choices[0].text == greedy


def _metric(server, name: str) -> float:
    return server.metrics()[f"fastdeploy:{name}"]


def test_strangers_unfinished_messages_cost_p_and_d_no_memory(deployment, greedy):
    prefill, decode = deployment.instances["prefill"], deployment.instances["decode"]
    pids = {name: server.engine_core_pid() for name, server in deployment.instances.items()}
    _serve(deployment, greedy)
    before = {name: rss_mib(pid) for name, pid in pids.items()}
    fake, lure, connections = FakeP(), Flood(), []
    try:
        at_d = threading.Thread(target=fake.flood_first_d, args=(STRANGER_BYTES,), daemon=True)
        at_d.start()
        lure.requests_to_d(decode, fake.address, 1, "lure")   # D connects to the "P" a client named
        for _ in range(STRANGERS):
            connections.append(open_to(connector_addr(deployment, "prefill")))
            flood(connections[-1], b"DEALER", STRANGER_BYTES)
        _serve(deployment, greedy)
        at_d.join(60)
        assert not at_d.is_alive(), "D never connected to the stranger P"
        for name, pid in pids.items():   # measured while the strangers still hold their connections
            grown = rss_mib(pid) - before[name]
            assert grown < RSS_BOUND_MIB, f"{name}'s engine core grew by {grown:.0f} MiB"
        lure.join()
    finally:
        for connection in connections:
            connection.close()
        fake.close()
        lure.stop()
        lure.join()
    assert {name: server.engine_core_pid() for name, server in deployment.instances.items()} == pids
    assert _metric(prefill, "free_slots") == _metric(prefill, "total_slots")
    _serve(deployment, greedy)


def _dead_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_requests_for_a_dead_p_hold_no_slot_while_good_requests_run(deployment, greedy):
    decode = deployment.instances["decode"]
    _serve(deployment, greedy)
    poisoned = Flood()
    try:
        poisoned.requests_to_d(decode, _dead_address(), POISONED, "dead")
        decode.wait_until(lambda s: _metric(s, "num_requests_waiting") > SLOTS,   # more than could hold a slot
                          "the poisoned requests reaching D's queue")
        assert _metric(decode, "free_slots") == _metric(decode, "total_slots"), "a request for a dead P holds a slot"
        _serve(deployment, greedy, times=3)
        poisoned.join()
    finally:
        poisoned.stop()
        poisoned.join()
    decode.wait_until(lambda s: _metric(s, "num_requests_waiting") == 0, "the poisoned requests failing")
    assert _metric(decode, "free_slots") == _metric(decode, "total_slots")
    deployment.wait_nothing_held("decode")
