"""A P host lost (SERVICES §6 "Across hosts"): its link goes down and every process on it is killed (no FIN
reaches D or the router) while P's hand-off is in progress (its blocks held, or its pieces queued behind the slowed
link: P frees the blocks once libzmq holds copies). The request in flight ends with a clear
error within the hand-off deadline (D's prefill-result deadline, or the router's lost-instance answer, whichever
comes first), D frees every block it reserved, the router takes the lost P out of service and pairs new requests
with the other P; when the host is back and its instance restarted, it registers again and serves (the other P is
then stopped, so every request must go through it)."""
from __future__ import annotations

import openai
import pytest

from tests.hosts import deployment as hosts_deploy
from tests.hosts.test_faults_across_hosts import (LONG_PROMPT, MODEL, PROMPTS, _complete_prompt,
                                                  _p_started_handoff, expected)  # noqa: F401  (expected: a fixture)
from tests.services.deployment import spec_flags

K = 1
DEADLINE_S = 10            # --pd-timeout-secs of every instance
SLOW = dict(rate="2mbit", burst="8kb", latency="30s", inbound=False)   # each P's sending: a long hand-off ~6 s
PREFILLS = ("prefill0", "prefill1")


def _flags() -> tuple[str, ...]:
    return (*spec_flags(K), "--pd-timeout-secs", str(DEADLINE_S))


def _deployment(net) -> hosts_deploy.HostDeployment:
    deployment = hosts_deploy.start_router(net["router"])
    for name in PREFILLS:
        deployment.add(name, net[name], "--splitwise-role", "prefill", *_flags(), model=MODEL)
    deployment.add("decode", net["decode"], "--splitwise-role", "decode", *_flags(), model=MODEL)
    return deployment


def _key(host) -> str:
    return f"{host.address}:{hosts_deploy.INSTANCE_PORT}"


def _healthy(deployment, host) -> bool:
    return deployment.registered().get(_key(host), {}).get("healthy", False)


def test_a_lost_prefill_host_fails_its_handoff_frees_d_and_serves_again_when_back(hosts, expected):
    net = hosts("router", *PREFILLS, "decode")
    deployment = _deployment(net)
    try:
        deployment.await_ready()
        for name in PREFILLS:
            net[name].set_rate(**SLOW)
        pending = deployment.client_host.submit(_complete_prompt, deployment, LONG_PROMPT, 120.0)
        started: list[str] = []   # the P named when the wait ends (asking again could find its blocks freed)

        def handoff_started(_) -> bool:
            started[:] = [name for name in PREFILLS if _p_started_handoff(deployment.instances[name])]
            return bool(started)

        deployment.router.wait_until(handoff_started, "a P streams a hand-off", timeout_s=60)
        lost = started[0]
        other = next(name for name in PREFILLS if name != lost)
        net[lost].link_down()
        net[lost].kill_all()
        net[other].clear_rate()
        with pytest.raises(openai.APIStatusError) as failure:
            pending.result(DEADLINE_S + 60)      # D's scaled deadline is DEADLINE_S + ~0.13 s
        message = str(failure.value)
        print("the request in flight on the lost P:", failure.value.status_code, message)
        assert failure.value.status_code in (502, 503), message
        assert "did not complete within" in message or "stopped answering" in message, message
        deployment.wait_nothing_held("decode", other)
        deployment.router.wait_until(lambda _: not _healthy(deployment, net[lost]),
                                     "the router takes the lost P out of service")
        for (prompt, max_tokens), want in zip(PROMPTS, expected):
            assert deployment.complete(MODEL, prompt, max_tokens).choices[0].text == want, prompt
        net[lost].clear_rate()
        net[lost].link_up()
        deployment.add(lost, net[lost], "--splitwise-role", "prefill", *_flags(), model=MODEL)
        deployment.await_ready()
        hosts_deploy.launcher.stop(deployment.instances.pop(other))   # every request must now go to the P back
        deployment.router.wait_until(lambda _: not _healthy(deployment, net[other]), "the stopped P out of service")
        for (prompt, max_tokens), want in zip(PROMPTS, expected):
            assert deployment.complete(MODEL, prompt, max_tokens).choices[0].text == want, prompt
        deployment.wait_nothing_held()
    finally:
        deployment.stop()
