"""Fault injection on the P→D hop (PD_MTP_FLOW §3, §5.2, I10): each fault fails only the request it hits, with a
clear error and finish reason "abort", never hangs, and leaves P, D and the transport drained (O3)."""
from __future__ import annotations

from fastdeploy.engine.connector.base import instance_config_hash
from fastdeploy.splitwise import HandoffDeadlines
from tests.splitwise.fakes import Fault
from tests.e2e.workloads import run

from .harness import assert_drained, assert_same_as_single, drive, start_pd, submit, toy_config
from .test_pd_scenarios import eos_case

DEADLINES = HandoffDeadlines(decode_allocation_s=50.0, kv_transfer_s=20.0, prefill_result_s=30.0)
K = 1


def cases():
    return [eos_case(f"r{i}", 4 + i, seed=80 + i) for i in range(4)]


def run_with_fault(fault: Fault | None, tick_s: float = 0.0, max_idle_steps: int = 60, **fault_options):
    pd = start_pd(K, deadlines=DEADLINES)
    if fault is not None:
        pd.engine.transport.inject_fault(fault, request_id="1", **fault_options)
    workload = cases()
    submit(pd, workload)
    drive(pd, tick_s=tick_s, max_idle_steps=max_idle_steps)
    assert_drained(pd)
    return pd, workload


def assert_only_request_1_failed(pd, workload, error: str) -> None:
    failed = pd.requests[1]
    assert failed.finish_reason == "abort" and failed.error.startswith(error), failed.error
    assert "1" not in pd.decode_tasks, "a failed hand-over must not be inserted"
    others = [0, 2, 3]
    single = run(workload, K)
    assert_same_as_single([workload[i] for i in others], [single[i] for i in others],
                          [pd.requests[i] for i in others])


def test_one_draft_id_fails_the_request_with_the_spec_error():
    """PD_MTP_FLOW §5.2 step 3: a hand-off with only [t0] under MTP (t0 not terminating) is rejected, nothing
    inserted."""
    pd, workload = run_with_fault(Fault.ONE_DRAFT_ID)
    assert_only_request_1_failed(pd, workload, "PD+MTP: request 1 arrived from P with 1 draft id; 2 are required "
                                               "(first token + one MTP draft)")


def test_corrupted_handoff_fails_the_request_at_the_integrity_check():
    """PD_MTP_FLOW §5.2 step 1: one flipped bit in the KV bytes breaks the integrity tag; the request fails at
    receipt."""
    pd, workload = run_with_fault(Fault.CORRUPT)
    assert_only_request_1_failed(pd, workload, "PD: request 1: corrupted/mismatched hand-over: integrity tag")


def test_kv_transfer_stalled_past_its_deadline_fails_the_request_and_reclaims_both_sides():
    """I10: the hand-off arrives after D's PREFILL_RESULT deadline: D fails the request and frees its
    preallocated blocks, P frees its blocks at its KV_TRANSFER deadline, and the late hand-off is acknowledged and
    dropped (never inserted into freed blocks)."""
    pd, workload = run_with_fault(Fault.STALL, tick_s=1.0, max_idle_steps=150, stall_s=100.0)
    assert_only_request_1_failed(pd, workload, "PD: request 1: prefill result did not complete within 30 s")


def test_lost_handoff_fails_the_request_at_the_deadline():
    """I10 "drop P's result": D's deadline fails the request; P's blocks come back at its own deadline."""
    pd, workload = run_with_fault(Fault.DROP, tick_s=1.0, max_idle_steps=150)
    assert_only_request_1_failed(pd, workload, "PD: request 1: prefill result did not complete within 30 s")
    assert pd.engine.transport.num_dropped == 1


def test_configuration_hash_mismatch_fails_every_handoff():
    """PD_MTP_FLOW §5.2 step 1 / PD_MTP_FLOW §3: a D configured differently from P (here K = 2 against P's K = 1)
    rejects every hand-off as mismatched instead of decoding garbage; all requests fail cleanly and everything
    drains."""
    pd = start_pd(K, deadlines=DEADLINES)
    pd.engine.decode.connector.config_hash = instance_config_hash(toy_config(2), pd.engine.decode.vocab_size)
    workload = cases()
    submit(pd, workload)
    drive(pd)
    assert_drained(pd)
    for request in pd.requests:
        assert request.finish_reason == "abort"
        assert "corrupted/mismatched hand-over: configuration hash" in request.error
    assert not pd.decode_tasks


def test_fault_free_run_has_no_failures():
    """Control for the tests above: the same workload without a fault fails nothing."""
    pd, workload = run_with_fault(None)
    single = run(workload, K)
    assert_same_as_single(workload, single, pd.requests)


def test_p_losing_the_request_after_d_preallocated_fails_it_at_the_deadline(monkeypatch):
    """I10 "kill P after D preallocated": P never receives request 1, so no hand-off comes; D's PREFILL_RESULT
    deadline fails it and frees D's reservation; the other requests are unaffected."""
    pd = start_pd(K, deadlines=DEADLINES)
    add_to_prefill = pd.engine.prefill.add_request
    monkeypatch.setattr(pd.engine.prefill, "add_request",
                        lambda rid, *args, **kwargs: None if rid == "1" else add_to_prefill(rid, *args, **kwargs))
    workload = cases()
    submit(pd, workload)
    drive(pd, tick_s=1.0, max_idle_steps=150)
    assert_drained(pd)
    assert_only_request_1_failed(pd, workload, "PD: request 1: prefill result did not complete within 30 s")


def test_decode_allocation_past_its_deadline_fails_the_request_holding_nothing():
    """I10, DECODE_ALLOCATION: a long request has grown into most of D's pool, so a later request with a long
    prompt cannot be preallocated before its deadline; it fails with a clear error, holding nothing on either
    side, and the long request completes unaffected."""
    deadlines = HandoffDeadlines(decode_allocation_s=3.0, kv_transfer_s=20.0, prefill_result_s=30.0)
    long_case = eos_case("long", 20, seed=90, max_tokens=40, min_tokens=40)
    late_case = eos_case("late", 5, seed=91, prompt_len=40)
    pd = start_pd(K, deadlines=deadlines, num_kv_blocks=18, max_model_len=80)
    submit(pd, [long_case])
    for _ in range(12):
        pd.engine.step()
        pd.clock.advance(1.0)
    assert pd.engine.decode.resources.num_free_blocks < 12, "the late request must not fit yet"
    submit(pd, [late_case])
    drive(pd, tick_s=1.0)
    assert_drained(pd)
    long_request, late_request = pd.requests
    assert long_request.error is None
    assert long_request.output_token_ids == run([long_case], K)[0].outputs.token_ids
    assert late_request.finish_reason == "abort" and late_request.output_token_ids == []
    assert late_request.error == "PD: request 1: decode allocation did not complete within 3 s"


def test_full_transport_delays_handoffs_without_losing_any():
    """docs/design.md §4 decision 7: a full transport refuses a hand-off; P keeps it and retries next step (bounded
    by KV_TRANSFER), so with room for one message at a time every request still completes as on a single
    instance."""
    workload = cases() + [eos_case(f"extra{i}", 3 + i, seed=95 + i) for i in range(4)]
    pd = start_pd(K, deadlines=DEADLINES, transport_capacity=1)
    submit(pd, workload)
    for _ in range(50):       # bounded: a step count, never a wait
        pd.engine.step()
        if "unsent hand-offs" in pd.engine.prefill.connector.describe_held():
            break
    assert "unsent hand-offs" in pd.engine.prefill.connector.describe_held(), "the transport never refused one"
    drive(pd)
    assert_drained(pd)
    assert_same_as_single(workload, run(workload, K), pd.requests)



def _raise_once_for_request_1(instance, name: str):
    """Make the worker half's `name` raise RuntimeError on its first call made while request 1 is the request
    the connector works on (found through its blocks)."""
    kv = instance.connector.kv
    original, hit = getattr(kv, name), []

    def failing(block_ids, *args):
        request = instance.scheduler.find("1")
        if not hit and request is not None and list(block_ids) == request.block_ids:
            hit.append(True)
            raise RuntimeError("injected fault")
        return original(block_ids, *args)

    setattr(kv, name, failing)
    return hit


def test_an_exception_taking_in_one_handoff_fails_that_request_only():
    """Nothing one request does takes an instance down: D's KV write raising for request 1 fails request 1 with
    the cause, acknowledges the hand-off (P frees its blocks) and leaves the others to finish as on a single
    instance."""
    pd = start_pd(K, deadlines=DEADLINES)
    hit = _raise_once_for_request_1(pd.engine.decode, "write_prompt_kv")
    workload = cases()
    submit(pd, workload)
    drive(pd)
    assert_drained(pd)
    assert hit
    assert_only_request_1_failed(pd, workload, "PD: request 1: the hand-off could not be taken in: injected fault")


def test_an_exception_sending_one_handoff_fails_that_request_only():
    """P's KV read raising for request 1 fails it on P with the cause, its blocks freed at once; the in-process
    router then aborts it on D, and the others finish as on a single instance."""
    pd = start_pd(K, deadlines=DEADLINES)
    prefill = pd.engine.prefill
    kv, original, hit = prefill.connector.kv, prefill.connector.kv.read_prompt_kv, []
    finished = prefill.connector.request_finished

    def fail_for_request_1(request):
        if request.request_id == "1" and not hit:
            hit.append(True)
            kv.read_prompt_kv = lambda *args: (_ for _ in ()).throw(RuntimeError("injected fault"))
        try:
            finished(request)
        finally:
            kv.read_prompt_kv = original

    prefill.connector.request_finished = fail_for_request_1
    workload = cases()
    submit(pd, workload)
    drive(pd)
    assert_drained(pd)
    assert hit
    assert_only_request_1_failed(pd, workload, "PD: request 1: the hand-off could not be sent: injected fault")
