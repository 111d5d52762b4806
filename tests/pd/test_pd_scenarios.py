"""The O4 seed scenarios of PD_MTP_FLOW §10.1 on a PD pair, one test per row, each checked against a single
instance (O1, and O2 where the row allows it) and for liveness and a drained state (O3, inside run_pd)."""
from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.model_executor.models import get_model
from tests.splitwise.fakes import Fault
from tests.e2e.workloads import Case, run

from .harness import assert_drained, assert_same_as_single, drive, run_pd, start_pd, submit, workload

MODEL = get_model("fd-toy")
EOS = MODEL.eos_token_ids[0]


def eos_case(name: str, eos_index: int, seed: int, prompt_len: int = 9, **params) -> Case:
    """A prompt whose greedy output has its first EOS at output index `eos_index` (0 = t0)."""
    return Case(name, MODEL.find_prompt(eos_index, prompt_len, seed), SamplingParams(**{"max_tokens": 24, **params}))


def compare(cases: list[Case], k: int, agreement: float = 0.7, **engine):
    """Run on a single instance and on PD with the same model; O1 + O2 + O3. Returns the PD run."""
    options = {"mtp_agreement": agreement}
    single = run(cases, k, model_options=options, **engine)
    pd = run_pd(cases, k, model_options=options, **engine)
    assert_same_as_single(cases, single, pd.requests)
    return pd


def test_eos_as_t0_finishes_at_receipt_without_a_decode_slot():
    """Row "EOS as t0": P reports [t0]; D finishes at receipt (PD_MTP_FLOW §5.2 step 2) with output [EOS]; no D slot is
    used and D's preallocated blocks are freed."""
    cases = [eos_case("eos_t0_a", 0, seed=1), eos_case("other", 6, seed=2), eos_case("eos_t0_b", 0, seed=3)]
    pd = compare(cases, k=1)
    for i in (0, 2):
        request = pd.requests[i]
        assert (request.output_token_ids, request.finish_reason) == ([EOS], "stop")
        assert request.request_id not in pd.decode_tasks
    assert pd.decode_tasks == {"1": 1}


@pytest.mark.parametrize("agreement, eos_index", [(0.0, 1), (1.0, 1), (1.0, 2)],
                         ids=["corrected_token_is_eos", "d1_is_eos_accepted", "bonus_token_is_eos"])
def test_eos_in_d_first_round_is_reported_and_released_in_that_step(agreement, eos_index):
    """Row "EOS in D's first round" (the FastDeploy hang, PD_MTP_FLOW §8): the EOS is reported in D's first round and
    the request finishes and frees its slot in the same step (I1, checked by the D trace checker)."""
    cases = [eos_case(f"eos_{eos_index}_{s}", eos_index, seed=s) for s in (11, 12)]
    pd = compare(cases, k=1, agreement=agreement)
    for request in pd.requests:
        assert request.output_token_ids[-1] == EOS and len(request.output_token_ids) == eos_index + 1
        assert request.metrics.num_decode_rounds == 1
    assert pd.decode_trace.releases_checked >= len(cases)


@pytest.mark.parametrize("eos_index", [4, 5])
def test_eos_inside_an_accepted_run_ends_the_output_at_the_eos(eos_index):
    """Row "EOS inside an accepted run (K >= 2)": with every draft accepted (K = 3), the round that meets EOS
    reports up to and including it, nothing after it, and the request finishes in that step."""
    cases = [eos_case(f"eos_{eos_index}_{s}", eos_index, seed=s) for s in (21, 22)]
    pd = compare(cases, k=3, agreement=1.0)
    for case, request in zip(cases, pd.requests):
        assert request.output_token_ids == MODEL.greedy_generate(case.prompt, 24)
        assert request.metrics.accepted_per_round == [2, eos_index - 2]   # [d1, x2], then the run up to EOS
    assert pd.decode_trace.releases_checked >= len(cases)


def test_max_tokens_1_finishes_at_receipt_with_t0():
    """Row `max_tokens = 1`: output [t0], reason "length", D finishes at receipt, no D slot used."""
    cases = [eos_case("max1", 5, seed=31, max_tokens=1)]
    pd = compare(cases, k=2)
    request = pd.requests[0]
    assert len(request.output_token_ids) == 1 and request.finish_reason == "length"
    assert not pd.decode_tasks


def test_max_tokens_2_gives_exactly_two_tokens_even_when_d1_is_accepted():
    """Row `max_tokens = 2`: exactly [t0, x1] from one D round although d1 is accepted (verify caps step_idx)."""
    cases = [eos_case("max2", 8, seed=41, max_tokens=2)]
    pd = compare(cases, k=1, agreement=1.0)
    request = pd.requests[0]
    assert request.output_token_ids == MODEL.greedy_generate(cases[0].prompt, 2)
    assert request.finish_reason == "length" and request.metrics.accepted_per_round == [1]


@pytest.mark.parametrize("k", [1, 2])
def test_min_tokens_beyond_the_eos_position_suppresses_eos(k):
    """Row `min_tokens` larger than the natural EOS position: no EOS before min_tokens tokens (per-position
    suppression, PD_MTP_FLOW §10.2), output length >= min_tokens, same as the single instance."""
    cases = [eos_case(f"min_over_eos_{e}", e, seed=50 + e, min_tokens=e + 3) for e in (0, 1, 2)]
    pd = compare(cases, k=k)
    for case, request in zip(cases, pd.requests):
        tokens = request.output_token_ids
        assert len(tokens) >= case.params.min_tokens
        assert EOS not in tokens[:case.params.min_tokens - 1]


@pytest.mark.parametrize("stop_len", [2, 1], ids=["t0_x1", "t0_alone"])
@pytest.mark.parametrize("k", [1, 2])
def test_stop_sequence_spanning_the_p_d_boundary_is_found_on_d(stop_len, k):
    """Row "stop sequence spanning the P/D boundary": a stop sequence [t0, x1] or [t0] is found on D through
    pre_ids[b, 1] = t0; output = the sequence then the end token, as on the single instance."""
    prompt = MODEL.find_prompt(14, 10, seed=61)
    greedy = MODEL.greedy_generate(prompt, 20)
    stop = MODEL.tokenizer.decode(greedy[:stop_len])
    cases = [Case("stop_span", prompt, SamplingParams(max_tokens=20, stop=[stop]))]
    pd = compare(cases, k=k)
    assert pd.requests[0].output_token_ids == greedy[:stop_len] + [EOS]
    assert pd.requests[0].finish_reason == "stop"


@pytest.mark.parametrize("k", [1, 2])
def test_parking_and_recovery_under_kv_pressure_keep_outputs_and_acceptance(k):
    """Row "block-step parking and recovery": with a small KV pool D parks slots and resumes them; outputs equal
    the unconstrained single instance (O1) and so does per-round acceptance for every request that was parked
    but not preempted (O2; a preemption recomputes the request, which legitimately restarts its rounds)."""
    cases = workload(3)
    pd = run_pd(cases, k, num_kv_blocks=36)
    reference = run(cases, k)
    preempted = {r.request_id for r in pd.requests if r.metrics.num_preemptions}
    assert_same_as_single(cases, reference, pd.requests, per_round=False)
    parked_only = pd.parked - preempted
    assert len(parked_only) >= 10
    for case, want, got in zip(cases, reference, pd.requests):
        if got.request_id not in preempted:
            assert got.metrics.accepted_per_round == want.metrics.accepted_per_round, f"O2: {case.name}"


@pytest.mark.parametrize("k", [1, 2])
def test_preemption_reports_minus_9_once_and_recomputes_on_d(k):
    """Row "preemption": with a pool small enough to force it, every preemption is reported by exactly one −9
    and the request is recomputed locally on D (PD_MTP_FLOW §12.2 decision); outputs equal the single instance (O1)."""
    rng = np.random.default_rng(5)
    cases = [Case(f"long_{i}", [256, *rng.integers(32, 127, int(rng.integers(4, 30))).tolist()],
                  SamplingParams(max_tokens=40, min_tokens=30)) for i in range(8)]
    pd = run_pd(cases, k, num_kv_blocks=34, max_num_seqs=4)
    preemptions = sum(r.metrics.num_preemptions for r in pd.requests)
    assert preemptions >= 1 and preemptions == pd.decode_trace.preemptions
    assert_same_as_single(cases, run(cases, 0), pd.requests, per_round=False)


def test_handover_with_only_t0_fails_that_request_only():
    """Row "hand-over with only [t0] under MTP, t0 not terminating": that request fails with the PD_MTP_FLOW §5.2 step 3
    error and uses no D slot; the other requests are unaffected; everything drains (O3)."""
    cases = [eos_case(f"r{i}", 5 + i, seed=70 + i) for i in range(4)]
    single = run(cases, 1)
    pd = start_pd(1)
    pd.engine.transport.inject_fault(Fault.ONE_DRAFT_ID, request_id="2")
    submit(pd, cases)
    drive(pd)
    assert_drained(pd)
    failed = pd.requests[2]
    assert failed.finish_reason == "abort" and failed.error == (
        "PD+MTP: request 2 arrived from P with 1 draft id; 2 are required (first token + one MTP draft)")
    assert "2" not in pd.decode_tasks
    others = [0, 1, 3]
    assert_same_as_single([cases[i] for i in others], [single[i] for i in others], [pd.requests[i] for i in others])
