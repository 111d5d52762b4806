"""PD across hosts (SERVICES §5, §6; README "PD across hosts"): the router on host 1, P on host 2 and D on host 3,
each instance bound to every interface with `--router <host 1>:9000` as a user starts it, registers the address of
its interface toward the router (never loopback), and the router's answers through P and D over ZeroMQ and over
Mooncake TCP are the single instance's greedy text (fd-tiny, MTP K = 1, prefix caching on)."""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from tests.hosts import deployment as hosts_deploy

MODEL = "fd-tiny"
K = 1
PROMPTS = [("On Monday, Judy", 16), ("The cat sat", 12), ("On Monday, Judy went to the market and", 20)]


@pytest.fixture(scope="module")
def expected():
    llm = LLM(model=MODEL, speculative_config={"method": "mtp", "num_speculative_tokens": K})
    outputs = llm.generate([p for p, _ in PROMPTS], [SamplingParams(max_tokens=n) for _, n in PROMPTS],
                           use_tqdm=False)
    return [output.outputs.text for output in outputs]


@pytest.mark.parametrize("transport", ["zmq", "mooncake-tcp"])
def test_pd_on_three_hosts_serves_the_single_instance_text(hosts, expected, transport):
    if transport != "zmq" and (reason := mooncake_unavailable_reason()) is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    net = hosts("router", "prefill", "decode")
    flags = hosts_deploy.MOONCAKE if transport != "zmq" else ()
    deployment = hosts_deploy.pd_across_hosts(net["router"], net["prefill"], net["decode"], k=K, flags=flags)
    try:
        deployment.await_ready()
        rows = deployment.registered()
        for role in ("prefill", "decode"):
            host = net[role]
            row = rows[f"{host.address}:{hosts_deploy.INSTANCE_PORT}"]
            assert (row["role"], row["connector_addr"]) == (role, f"{host.address}:{hosts_deploy.PD_COMM_PORT}")
        for (prompt, max_tokens), want in zip(PROMPTS, expected):
            got = deployment.complete(MODEL, prompt, max_tokens)
            assert got.choices[0].text == want, prompt
        again = deployment.complete(MODEL, PROMPTS[2][0], PROMPTS[2][1])    # a prefix-cache hit on P
        assert again.choices[0].text == expected[2]
        deployment.wait_nothing_held()
    finally:
        deployment.stop()
