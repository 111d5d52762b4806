"""PD across hosts (SERVICES §5, §6; README "PD across hosts"): the router on host 1, P on host 2 and D on host 3,
each instance bound to every interface with `--router <host 1>:9000` as a user starts it, registers the address of
its interface toward the router (never loopback), and the router's answers through P and D over ZeroMQ and over
Mooncake TCP are the single instance's greedy text (fd-tiny, MTP K = 1, prefix caching on); the same for 2 P and 2
D on five hosts, for P and D behind sglang-router on three, and for a checkpoint directory as users deploy one
(ERNIE-4.5 MoE with its MTP weights, FastDeploy's Paddle layout) over ZeroMQ."""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from tests.checkpoint_files import reference_missing, write_ernie4_5_moe_checkpoint
from tests.hosts import deployment as hosts_deploy
from tests.services.deployment import spec_flags

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


def test_two_prefill_two_decode_on_five_hosts_serve_the_single_instance_text(hosts, expected):
    """2P2D, each instance on its own host: every P and every D serves requests, each answer the single
    instance's text."""
    net = hosts("router", "prefill0", "prefill1", "decode0", "decode1")
    deployment = hosts_deploy.start_router(net["router"])
    for name in ("prefill0", "prefill1", "decode0", "decode1"):
        role = name.rstrip("01")
        deployment.add(name, net[name], "--splitwise-role", role, *spec_flags(K), model=MODEL)
    try:
        deployment.await_ready()
        for _ in range(2):
            for (prompt, max_tokens), want in zip(PROMPTS, expected):
                assert deployment.complete(MODEL, prompt, max_tokens).choices[0].text == want, prompt
        assigned = {key: row["assigned"] for key, row in deployment.registered().items()}
        assert all(assigned.values()), f"an instance got no request: {assigned}"
        deployment.wait_nothing_held()
    finally:
        deployment.stop()


@pytest.mark.parametrize("transport", ["zmq", "mooncake-tcp"])
def test_sglang_router_across_hosts_serves_the_single_instance_text(hosts, expected, transport):
    """sglang-router on host 1 given P's and D's URLs on hosts 2 and 3 (P's bootstrap port its --pd-comm-port):
    D reaches P's connector at the host sglang-router names, and the answers are the single instance's text. With
    Mooncake, P writes into D's segment at the address D advertises: with no router to aim at, P and D are given
    `--advertise-host` (README "PD across hosts"; without it D advertises its host name's address, loopback here,
    and warns at start)."""
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        pytest.skip("sglang-router is not installed (the `router` extra)")
    if transport != "zmq" and (reason := mooncake_unavailable_reason()) is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    net = hosts("router", "prefill", "decode")
    mooncake = transport != "zmq"
    deployment = hosts_deploy.sglang_across_hosts(net["router"], [net["prefill"]], [net["decode"]], k=K,
                                                  flags=hosts_deploy.MOONCAKE if mooncake else (), advertise=mooncake)
    try:
        hosts_deploy.await_sglang_ready(deployment)
        for (prompt, max_tokens), want in zip(PROMPTS, expected):
            assert deployment.complete(MODEL, prompt, max_tokens).choices[0].text == want, prompt
        deployment.wait_nothing_held()
    finally:
        deployment.stop()


def test_a_checkpoint_directory_across_three_hosts_serves_the_single_instance_text(hosts, tmp_path_factory):
    """Every host reads the same directory path (the namespaces share the file system, as hosts mounting one
    model store do): P and D on their own hosts with MTP K = 1 from the checkpoint's own MTP weights answer the
    single instance's greedy text without speculation, and a repeated prompt is a prefix-cache hit on D."""
    if (reason := reference_missing()) is not None:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("hosts_ckpt") / "ERNIE-4.5-moe-tiny-hosts"
    write_ernie4_5_moe_checkpoint(directory, layout="paddle", seed=6)
    prompts = [("hello world", 20), ("the cat sat on", 16),
               ("hello world and the cat sat on the mat while the dog ran in the park on monday", 24)]
    outputs = LLM(model=str(directory)).generate([p for p, _ in prompts],
                                                  [SamplingParams(max_tokens=n) for _, n in prompts], use_tqdm=False)
    want = [output.outputs.text for output in outputs]
    assert all(want), want
    net = hosts("router", "prefill", "decode")
    deployment = hosts_deploy.pd_across_hosts(net["router"], net["prefill"], net["decode"], k=K,
                                              model=str(directory))
    try:
        deployment.await_ready()
        for (prompt, max_tokens), text in zip(prompts, want):
            assert deployment.complete(directory.name, prompt, max_tokens).choices[0].text == text, prompt
        again = deployment.complete(directory.name, *prompts[2])       # the prompt's blocks cached on D now
        assert again.choices[0].text == want[2]
        assert again.usage.prompt_tokens_details.cached_tokens > 0, again.usage
        deployment.wait_nothing_held()
    finally:
        deployment.stop()
