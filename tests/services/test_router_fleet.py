"""O1 through a router in front of a fleet (docs/design.md "Router"): 2 P + 2 D on fd-toy with MTP K = 2 and
1 P + 2 D on fd-tiny with MTP K = 1 give the `openai` client the in-process `LLM`'s greedy text, finish reason and
token counts, streamed and not, and every instance serves at least one of those requests (the router's counts and
each instance's own /metrics agree)."""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from tests.services import deployment as deploy
from tests.services.test_router_oracle import TINY_WORKLOAD, toy_workload

# five or six processes start in the first test's fixture on two busy cores
pytestmark = pytest.mark.timeout(400)
# (model, K, number of P, number of D)
FLEETS = [("fd-toy", 2, 2, 2), ("fd-tiny", 1, 1, 2)]


@pytest.fixture(scope="module", params=FLEETS, ids=[f"{p}P{d}D-{m}-k{k}" for m, k, p, d in FLEETS])
def fleet(request):
    model, k, num_prefill, num_decode = request.param
    workload = toy_workload() if model == "fd-toy" else TINY_WORKLOAD
    deployment = deploy.fleet_deployment(model, k, num_prefill, num_decode, wait=False)
    try:
        llm = LLM(model=model, speculative_config={"method": "mtp", "num_speculative_tokens": k})
        params = [SamplingParams(max_tokens=c.max_tokens, min_tokens=c.min_tokens, stop=c.stop) for c in workload]
        expected = llm.generate([c.prompt for c in workload], params, use_tqdm=False)
        deployment.await_ready()
        with deployment.client() as client:
            yield model, workload, expected, client, deployment
        deployment.wait_nothing_held()
    finally:
        deployment.stop()


def test_greedy_completions_through_the_fleet_equal_in_process_llm(fleet):
    model, workload, expected, client, _ = fleet
    for c, want in zip(workload, expected):
        got = client.completions.create(model=model, prompt=c.prompt, max_tokens=c.max_tokens, temperature=0,
                                        stop=c.stop, extra_body={"min_tokens": c.min_tokens})
        assert (got.choices[0].text, got.choices[0].finish_reason) == (want.outputs.text,
                                                                      want.outputs.finish_reason), c.name
        assert got.usage.completion_tokens == len(want.outputs.token_ids), c.name


def test_streamed_through_the_fleet_equals_in_process_text(fleet):
    model, workload, expected, client, _ = fleet
    for c, want in zip(workload, expected):
        chunks = list(client.completions.create(model=model, prompt=c.prompt, max_tokens=c.max_tokens,
                                                temperature=0, stop=c.stop, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body={"min_tokens": c.min_tokens}))
        text_chunks = [chunk for chunk in chunks if chunk.choices]
        assert "".join(chunk.choices[0].text for chunk in text_chunks) == want.outputs.text, c.name
        assert text_chunks[-1].choices[0].finish_reason == want.outputs.finish_reason, c.name
        assert chunks[-1].usage.completion_tokens == len(want.outputs.token_ids), c.name


def test_every_instance_served_and_the_router_reports_each_ones_load(fleet):
    """After the two tests above, every P and D has served: the router counts requests to each, and each
    instance's own /metrics counts requests received; the router's rows carry the ranking inputs (outstanding
    prefill work, free capacity) and the load of the latest heartbeat."""
    _, _, _, _, deployment = fleet
    rows = deploy.registered(deployment.router)
    for name, server in deployment.instances.items():
        row = rows[server.port]
        assert row["assigned"] >= 1, (name, row)
        assert server.metrics()["fastdeploy:requests_number_total"] >= 1, name
        assert row["outstanding_prefill_work"] >= 0 and row["free_capacity"] >= 0, row
        assert row["load"] is not None and row["load"]["total_slots"] == row["max_num_seqs"], row
    router_metrics = deployment.router.metrics()
    for server in deployment.instances.values():
        labels = f"instance=127.0.0.1:{server.port},role={rows[server.port]['role']}"
        assert router_metrics[f"fastdeploy_router:instance_free_capacity{{{labels}}}"] >= 0
        assert f"fastdeploy_router:instance_outstanding_prefill_work{{{labels}}}" in router_metrics
