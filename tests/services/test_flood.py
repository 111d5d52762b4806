"""The flood battery against a real router, P and D (docs/design.md §8, "Floods"; SERVICES §7): junk frames nonstop
at P's connector port and, from a "P" D was sent to, at D's DEALER, while requests run (with and without a PD
secret); 65k reservations from one D; a 1 GiB frame at P's port and from a "P" at D; 100 requests to D paired with
a P address where nothing answers. During and after each, requests through the router are served the in-process
LLM's greedy text, every engine core is the process it was, and its resident memory grew by less than
RSS_BOUND_MIB. Each flood's refusals are counted (the proof it reached the connector's parser).

The junk floods last FD_FLOOD_SECONDS (3 s by default, to keep CI on two cores fast; the issue's 20 s run is
`FD_FLOOD_SECONDS=20`); benchmarks/pd_flood_ttft.py measures the good requests' TTFT during them."""
from __future__ import annotations

import os
import time

import pytest

from fastdeploy import LLM, SamplingParams
from tests.services import deployment as deploy
from tests.services.flood import SILENT, Flood, connector_addr, refused, rss_mib

PROMPT = "On Monday, Judy"
FLOOD_S = float(os.environ.get("FD_FLOOD_SECONDS", "3"))
RSS_BOUND_MIB = 256    # what any flood may add to an engine core's resident memory (its queues and caps: SERVICES §7)
# Heartbeats every 2 s (not the suite's 0.25 s): on two shared cores a flooder, its victim and a neighbour test can
# starve an API server for more than three 0.25 s intervals, and the router would then drop a healthy P (503).
HEALTH = ("--health-interval-secs", "2")
FLAGS = ("--pd-timeout-secs", "10", *HEALTH)
D_FLAGS = (*FLAGS, "--max-num-seqs", "72", "--pd-reservation-ack-timeout-secs", "1")


@pytest.fixture(scope="module")
def greedy() -> str:
    return LLM(model="fd-toy").generate([PROMPT], SamplingParams(max_tokens=8), use_tqdm=False)[0].outputs.text


class Watch:
    """The engine cores of a deployment: the same processes, each within RSS_BOUND_MIB of where it started."""

    def __init__(self, deployment: deploy.Deployment, greedy: str):
        self.deployment, self.greedy = deployment, greedy
        self.pids = {name: server.engine_core_pid() for name, server in deployment.instances.items()}
        self.rss = {name: rss_mib(pid) for name, pid in self.pids.items()}
        self.client = deployment.client()

    def serve(self, times: int = 1) -> None:
        for _ in range(times):
            answer = self.client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=8)
            assert answer.choices[0].text == self.greedy

    def check(self, what: str) -> None:
        self.serve()
        for name, server in self.deployment.instances.items():
            assert server.engine_core_pid() == self.pids[name], f"{what}: {name}'s engine core was restarted"
            grown = rss_mib(self.pids[name]) - self.rss[name]
            assert grown < RSS_BOUND_MIB, f"{what}: {name}'s engine core grew by {grown:.0f} MiB"


def _junk_while_serving(deployment: deploy.Deployment, watch: Watch) -> None:
    prefill, decode = deployment.instances["prefill"], deployment.instances["decode"]
    before = (refused(prefill, "malformed"), refused(decode, "malformed"))
    flood = Flood()
    try:
        flood.junk_at_p(deployment)
        flood.junk_at_d(deployment)
        end = time.monotonic() + FLOOD_S
        while time.monotonic() < end:   # requests run through the floods
            watch.serve()
        assert refused(prefill, "malformed") - before[0] > 1000, "the junk flood did not reach P"
        assert refused(decode, "malformed") - before[1] > 1000, "the junk flood did not reach D"
        assert all(process.poll() is None for process in flood.processes), "a flood ended early"
    finally:
        flood.stop()
        flood.join()
    watch.check("junk frames")


@pytest.mark.parametrize("secret", [None, "flood-battery-secret"], ids=["no-secret", "secret"])
def test_junk_frames_at_p_and_d_while_requests_run(tmp_path, greedy, secret):
    flags = deploy.secret_flags(tmp_path, secret)
    deployment = deploy.pd_deployment(prefill_flags=(*FLAGS, *flags), decode_flags=(*D_FLAGS, *flags),
                                      router_flags=HEALTH)
    try:
        watch = Watch(deployment, greedy)
        watch.serve()
        _junk_while_serving(deployment, watch)
        if secret is None:   # the floods below need no secret variant: none of them gets past its cap or limit
            _reservations_frames_and_a_silent_p(deployment, watch)
    finally:
        deployment.stop()


def _reservations_frames_and_a_silent_p(deployment: deploy.Deployment, watch: Watch) -> None:
    prefill, decode = deployment.instances["prefill"], deployment.instances["decode"]
    flood = Flood()
    try:
        full = refused(prefill, "full")
        flood.flooder("reserve", connector_addr(deployment, "prefill"), "65600", "0", read_line=True)
        prefill.wait_until(lambda s: refused(s, "full") - full >= 65600 - 4096, "P refuses past its per-D cap",
                           timeout_s=90)
        watch.check("65k reservations")

        flood.flooder("big", connector_addr(deployment, "prefill"), str(1 << 30), read_line=True)
        flood.flooder("fake-p", "big", str(1 << 30), read_line=True)
        flood.requests_to_d(decode, flood.lines[-1], 1, "big")
        assert flood.processes[-1].stdout.readline().strip() == "disconnected"   # D dropped the "P"
        assert flood.lines[-2] == "disconnected"                                 # P dropped the "D"
        watch.check("1 GiB frames")

        flood.requests_to_d(decode, SILENT, 100, "silent")
        watch.serve(3)   # served while D's queue to the silent address is full
        flood.join()
        watch.check("100 reservations to a P that never answers")
    finally:
        flood.stop()
        flood.join()
