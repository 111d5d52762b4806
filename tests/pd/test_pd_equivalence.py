"""O1, O2 and O3 of PD_MTP_FLOW §10.1 on the e2e workload (fd-toy): the four configurations {single, PD} x
{no speculation, MTP} give identical greedy outputs; single-instance MTP and PD MTP accept exactly the same drafts
in every decode round; both PD instances drain completely."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tests.e2e.workloads import Case, assert_same_outputs, run

from .harness import assert_same_as_single, drive, run_pd, start_pd, submit, workload

SEED = 11


@pytest.fixture(scope="module")
def cases():
    return workload(SEED)


@pytest.fixture(scope="module")
def single_no_spec(cases):
    return run(cases, k=0)


def test_pd_without_speculation_equals_single_instance(cases, single_no_spec):
    """O1 {PD, no spec} = {single, no spec}; O3 on P and D (checked inside run_pd)."""
    pd = run_pd(cases, k=0)
    assert_same_as_single(cases, single_no_spec, pd.requests, per_round=False)
    assert pd.decode_trace.releases_checked > 0


@pytest.mark.parametrize("k", [1, 2])
def test_pd_mtp_equals_single_mtp_per_request_and_per_round(cases, single_no_spec, k):
    """O1 {PD, MTP} = {single, MTP} = {single, no spec}; O2: per request, accepted tokens of every decode round
    and drafts verified are identical between single-instance MTP and PD MTP (exact, PD_MTP_FLOW §10.1)."""
    single_mtp = run(cases, k=k)
    assert_same_outputs(cases, single_no_spec, single_mtp)
    pd = run_pd(cases, k=k)
    assert_same_as_single(cases, single_mtp, pd.requests, per_round=True)
    rounds = [n for r in pd.requests for n in r.metrics.accepted_per_round]
    assert 1 in rounds and k + 1 in rounds, "the workload must both reject and fully accept drafts"


@pytest.mark.parametrize("k", [0, 1])
def test_pd_seeded_sampling_equals_single_instance(cases, k):
    """PD_MTP_FLOW §3: D applies exactly the sampling values P used, seed included, so seeded temperature / top-p
    sampling emits the single instance's tokens under PD (the verify rule makes seeded outputs independent of K)."""
    sampled = [Case(c.name, c.prompt, replace(c.params, temperature=0.8, top_p=0.9, seed=100 + i))
               for i, c in enumerate(cases[:24])]
    single = run(sampled, k)
    pd = run_pd(sampled, k)
    assert_same_as_single(sampled, single, pd.requests, per_round=k > 0)
    inserted = [i for i, r in enumerate(pd.requests) if r.request_id in pd.decode_tasks]
    assert len(inserted) >= 20 and all(pd.requests[i].seed == 100 + i for i in inserted)


def test_d_samples_with_the_seed_p_drew_when_the_request_has_none(cases):
    """PD_MTP_FLOW §3: a request without a seed gets one drawn at admission on P; D continues with that seed, not one of
    its own, so a sampled request is one draw of a single seeded sequence across the P/D boundary."""
    sampled = [Case(c.name, c.prompt, replace(c.params, temperature=0.8)) for c in cases[:8]]
    pd = start_pd(1)
    connector = pd.engine.prefill.connector
    drawn, request_finished = {}, connector.request_finished

    def record_and_hand_off(request):
        drawn[request.request_id] = request.seed
        request_finished(request)

    connector.request_finished = record_and_hand_off
    submit(pd, sampled)
    drive(pd)
    inserted = [r for r in pd.requests if r.request_id in pd.decode_tasks]
    assert inserted and all(r.seed == drawn[r.request_id] for r in inserted)


def test_pd_on_the_gpu_runner_equals_the_xpu_runner(cases):
    """The D insertion (PD_MTP_FLOW §5.3) and the proposer's first-round state (PD_MTP_FLOW §5.4) live
    in the shared runner base, so PD MTP on the GPU runner gives the XPU runner's outputs and per-round acceptance."""
    subset = cases[:24]
    xpu, gpu = run_pd(subset, 1, runner="xpu"), run_pd(subset, 1, runner="gpu")
    assert type(gpu.engine.decode.runner).__name__ == "GPUModelRunner"
    for case, a, b in zip(subset, xpu.requests, gpu.requests):
        assert (a.output_token_ids, a.metrics.accepted_per_round) == \
            (b.output_token_ids, b.metrics.accepted_per_round), case.name
