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
from tests.services.flood import (SILENT, Flood, connector_addr, flood_slowdown, mem_available, refused,
                                 rss_mib)

PROMPT = "On Monday, Judy"
FLOOD_S = float(os.environ.get("FD_FLOOD_SECONDS", "3"))
RSS_BOUND_MIB = 256    # what any flood may add to an engine core's resident memory (its queues and caps: SERVICES §7)
# Heartbeats and health checks every 5 s, the default (the suite's 0.25 s, or round 5's 2 s: a flooder, its victim
# and a neighbour test on two cores can starve an API server for three intervals, and the router would then drop a
# healthy P or call it unhealthy: 503).
HEALTH = ("--health-interval-secs", "5")
BOUND_S = 150.0   # each wait's bound: it only turns a hang into a failure
FLOODER_BOUND_MIB = 256   # a flooder's resident memory: Python, pyzmq and its queues, not its 1 GiB frame


def deadline_flags() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """P's and D's flags. The battery runs where other work loads the machine too (two shared cores in CI), so its
    deadlines are the production defaults or longer, times how loaded the machine is now: a good request whose
    reservation or hand-off missed its deadline fails the test although nothing was wrong (round 5 set D's
    reservation-ack deadline to 1 s, and a starved P acknowledged a good request later). Nothing is timed: the
    deadlines only bound how long the silent reservations at the end hold D's slots."""
    slowdown = flood_slowdown()
    flags = ("--pd-timeout-secs", f"{15 * slowdown:g}", *HEALTH)
    return flags, (*flags, "--max-num-seqs", "72", "--pd-reservation-ack-timeout-secs", f"{5 * slowdown:g}")


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
            # The API server's log says who ended a core: "exited with status -9" (a SIGKILL from outside: the OOM
            # killer, or anyone) or "sent no heartbeat" (its own watchdog); the machine's free memory goes with it.
            assert server.engine_core_pid() == self.pids[name], (
                f"{what}: {name}'s engine core was restarted; {mem_available()}\n{server.log()[-3000:]}")
            grown = rss_mib(self.pids[name]) - self.rss[name]
            assert grown < RSS_BOUND_MIB, f"{what}: {name}'s engine core grew by {grown:.0f} MiB"


def _junk_while_serving(deployment: deploy.Deployment, watch: Watch) -> Flood:
    """The junk floods, stopped; returned for the caller to join: the lure request to D ends only at its own
    deadline (seconds), and the battery's next floods need not wait for it."""
    prefill, decode = deployment.instances["prefill"], deployment.instances["decode"]
    before = (refused(prefill, "malformed"), refused(decode, "malformed"))

    def reached(count: int) -> bool:
        return (refused(prefill, "malformed") - before[0] > count and
                refused(decode, "malformed") - before[1] > count)

    flood = Flood()
    try:
        flood.junk_at_p(deployment)
        flood.junk_at_d(deployment)
        # Requests run through the floods for FLOOD_S, and on until each flood has been refused 1000 times (on a
        # loaded machine the flooders and the connectors' threads get less of the CPU: the proof still comes).
        end, bound = time.monotonic() + FLOOD_S, time.monotonic() + BOUND_S
        while time.monotonic() < end or not reached(1000):
            assert time.monotonic() < bound, f"the junk floods were not refused 1000 times in {BOUND_S:g} s"
            assert all(process.poll() is None for process in flood.processes), "a flood ended early"
            watch.serve()
    finally:
        flood.stop()
    watch.check("junk frames")
    return flood


@pytest.mark.timeout(4 * BOUND_S)   # long by design (docs/testing.md "Time limits"): 75-100 s on two busy cores
@pytest.mark.parametrize("secret", [None, "flood-battery-secret"], ids=["no-secret", "secret"])
def test_junk_frames_at_p_and_d_while_requests_run(tmp_path, greedy, secret):
    flags = deploy.secret_flags(tmp_path, secret)
    p_flags, d_flags = deadline_flags()
    deployment = deploy.pd_deployment(prefill_flags=(*p_flags, *flags), decode_flags=(*d_flags, *flags),
                                      router_flags=HEALTH)
    try:
        watch = Watch(deployment, greedy)
        watch.serve()
        junk = _junk_while_serving(deployment, watch)
        if secret is None:   # the floods below need no secret variant: none of them gets past its cap or limit
            _reservations_frames_and_a_silent_p(deployment, watch)
        junk.join(BOUND_S)
    finally:
        deployment.stop()


def _reservations_frames_and_a_silent_p(deployment: deploy.Deployment, watch: Watch) -> None:
    prefill, decode = deployment.instances["prefill"], deployment.instances["decode"]
    flood = Flood()
    try:
        full = refused(prefill, "full")
        flood.flooder("reserve", connector_addr(deployment, "prefill"), "65600", "0", read_line=True)
        prefill.wait_until(lambda s: refused(s, "full") - full >= 65600 - 4096, "P refuses past its per-D cap",
                           timeout_s=BOUND_S)
        watch.check("65k reservations")

        flood.flooder("big", connector_addr(deployment, "prefill"), str(1 << 30), read_line=True)
        flood.flooder("fake-p", "big", str(1 << 30), read_line=True)
        flood.requests_to_d(decode, flood.lines[-1], 1, "big")
        assert flood.processes[-1].stdout.readline().strip() == "disconnected"   # D dropped the "P"
        assert flood.lines[-2] == "disconnected"                                 # P dropped the "D"
        # The frames cost their senders no memory either (round 5's held 1 GiB each: 2 GiB of the machine's memory,
        # a candidate for the OOM killer's SIGKILL of an engine core seen under load).
        for big in flood.processes[-2:]:
            assert rss_mib(big.pid) < FLOODER_BOUND_MIB, f"a 1 GiB flooder holds {rss_mib(big.pid):.0f} MiB"
        watch.check("1 GiB frames")

        flood.requests_to_d(decode, SILENT, 100, "silent")
        watch.serve(3)   # served while D's queue to the silent address is full
        flood.join(BOUND_S)
        watch.check("100 reservations to a P that never answers")
    finally:
        flood.stop()
        flood.join()
