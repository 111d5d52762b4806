"""2 P + 2 D behind the real sglang-router (docs/design.md §8, "sglang-router"): each request names its P by
sglang-router's bootstrap fields (`bootstrap_host`, `bootstrap_port`, `bootstrap_room`), whichever D it lands on, and
the `openai` client gets the in-process `LLM`'s greedy text, streamed and not, with every P and D serving
(round-robin policy, so that every instance's share is certain)."""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from tests.services import launcher
from tests.services.sglang_deployment import start_deployment

pytest.importorskip("sglang_router", reason="sglang-router is not installed (pip install -e \".[router]\")")

# five or six processes start in the first test's fixture on two busy cores
pytestmark = pytest.mark.timeout(400)
MODEL, K = "fd-toy", 1
PROMPTS = ["On Monday, Judy", "The cat sat", "hello world", "abc"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    deployment = start_deployment(MODEL, K, tmp_path_factory.mktemp("sglang-fleet"), num_prefill=2, num_decode=2,
                                  router_flags=("--policy", "round_robin"))
    try:
        llm = LLM(model=MODEL, speculative_config={"method": "mtp", "num_speculative_tokens": K})
        oracle = {p: o.outputs for p, o in zip(PROMPTS, llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS),
                                                                      use_tqdm=False))}
        deployment.await_ready()
        yield deployment, oracle
        for server in (*deployment.prefills, *deployment.decodes):
            server.wait_until(launcher.nothing_held, "nothing held", timeout_s=30)
    finally:
        deployment.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_greedy_text_through_sglang_router_in_front_of_two_p_and_two_d(served, stream):
    deployment, oracle = served
    with deployment.client() as client:
        for prompt in PROMPTS:
            got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, stream=stream)
            if stream:
                chunks = [chunk for chunk in got if chunk.choices]
                text = "".join(chunk.choices[0].text or "" for chunk in chunks)
                finish = chunks[-1].choices[0].finish_reason
            else:
                text, finish = got.choices[0].text, got.choices[0].finish_reason
            assert (text, finish) == (oracle[prompt].text, oracle[prompt].finish_reason), prompt


def test_every_prefill_and_decode_served(served):
    """After the 8 requests above, each of the four instances counts requests of its own."""
    deployment, _ = served
    for server in (*deployment.prefills, *deployment.decodes):
        assert server.metrics()["fastdeploy:requests_number_total"] >= 1, server.flags
    assert sorted(w["worker_type"] for w in deployment.workers()) == ["decode"] * 2 + ["prefill"] * 2
