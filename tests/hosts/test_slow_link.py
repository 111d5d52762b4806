"""A slow P→D link (SERVICES §6 "Across hosts", "a slow link"): the hand-off's deadlines scale with its KV bytes
at a floor rate (`--pd-min-transfer-mbps`), not a fixed timeout.

P's sending is limited by `tbf` so that a 400-token prompt's hand-off (about 1.6 MB with the MTP layer) takes
several seconds, longer than the 3 s `--pd-timeout-secs` of both instances. (At 100 Mbit/s fd-tiny's largest
hand-off moves in well under a second, far inside any timeout: the link is slowed further so that the bytes, not
the prefill, decide the outcome. The rule is the same at every rate.) With a floor below the link's rate the request
completes with the single instance's text although it outlives the fixed timeout; with a floor above it the request
fails at the scaled deadline with an error naming the bytes and the floor. Nothing is held afterwards."""
from __future__ import annotations

import time

import openai
import pytest

from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from tests.hosts import deployment as hosts_deploy
from tests.hosts.test_faults_across_hosts import LONG_PROMPT, MODEL, _complete_prompt, _long_prompt_text
from tests.services.deployment import spec_flags

K = 1
BASE_S = 3                  # --pd-timeout-secs: shorter than the hand-off takes over the slow link
SLOW = dict(rate="2mbit", burst="8kb", latency="30s", inbound=False)   # P's sending: the hand-off ~6-7 s
FITS_MBPS = 1               # floor below the link's 2 Mbit/s: the deadline grows by ~13 s for 1.6 MB
ABOVE_MBPS = 100            # floor above it: the deadline grows by ~0.13 s, the hand-off cannot make it


def _deployment(net, transport: str, floor_mbps: int) -> hosts_deploy.HostDeployment:
    flags = (*spec_flags(K), "--pd-timeout-secs", str(BASE_S), "--pd-min-transfer-mbps", str(floor_mbps),
             *(hosts_deploy.MOONCAKE if transport != "zmq" else ()))
    deployment = hosts_deploy.start_router(net["router"])
    deployment.add("prefill", net["prefill"], "--splitwise-role", "prefill", *flags, model=MODEL)
    deployment.add("decode", net["decode"], "--splitwise-role", "decode", *flags,
                   "--pd-reservation-ack-timeout-secs", "10", model=MODEL)
    return deployment


@pytest.mark.parametrize("transport, floor_mbps", [("zmq", FITS_MBPS), ("zmq", ABOVE_MBPS),
                                                   ("mooncake-tcp", FITS_MBPS)],
                         ids=["zmq-floor-below-the-link", "zmq-floor-above-the-link", "mooncake-floor-below"])
def test_handoff_deadline_follows_its_bytes_over_a_slow_link(hosts, transport, floor_mbps):
    if transport != "zmq" and (reason := mooncake_unavailable_reason()) is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    want = _long_prompt_text()
    net = hosts("router", "prefill", "decode")
    deployment = _deployment(net, transport, floor_mbps)
    try:
        deployment.await_ready()
        net["prefill"].set_rate(**SLOW)
        started = time.monotonic()
        pending = deployment.client_host.submit(_complete_prompt, deployment, LONG_PROMPT, 120.0)
        if floor_mbps == FITS_MBPS:
            assert pending.result(120).choices[0].text == want
            print(f"served in {time.monotonic() - started:.1f} s over the slow link ({BASE_S} s fixed timeout)")
        else:
            with pytest.raises(openai.APIStatusError) as failure:
                pending.result(BASE_S + 60)
            message = str(failure.value)
            assert failure.value.status_code == 503, message
            assert f"did not complete within {BASE_S} s + " in message, message
            assert f"bytes of KV at the {ABOVE_MBPS} Mbit/s floor (--pd-min-transfer-mbps)" in message, message
        net["prefill"].clear_rate()
        deployment.wait_nothing_held()
    finally:
        deployment.stop()
