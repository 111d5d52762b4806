"""P's count of hand-offs it gave up sending (FastDeploy's `send_cache_failed_num`, docs/serving.md "Metrics"): a
hand-off the transport refuses until its KV-transfer deadline fails its request and counts once; the others are
sent and count nothing."""
from __future__ import annotations

from fastdeploy.splitwise import HandoffDeadlines, TransportFullError

from .harness import assert_drained, drive, start_pd, submit
from .test_pd_scenarios import eos_case

DEADLINES = HandoffDeadlines(decode_allocation_s=50.0, kv_transfer_s=5.0, prefill_result_s=30.0)


def test_a_handoff_never_sent_by_its_deadline_counts_one_send_failure(monkeypatch):
    pd = start_pd(1, deadlines=DEADLINES)
    transport_send = pd.engine.transport.send

    def refuse_request_1(request_id, payload):
        if request_id == "1":
            raise TransportFullError("test: D's queue stays full for request 1")
        return transport_send(request_id, payload)

    monkeypatch.setattr(pd.engine.transport, "send", refuse_request_1)
    submit(pd, [eos_case(f"r{i}", 4 + i, seed=80 + i, max_tokens=6) for i in range(3)])
    drive(pd, tick_s=1.0, max_idle_steps=150)
    assert_drained(pd)
    counters = pd.engine.prefill.pd_counters()
    assert (counters["send_failed"], counters["handoffs_sent"]) == (1, 2)
    failed = pd.requests[1]
    # P gave up at its KV-transfer deadline (5 s); D fails the request at its own prefill-result deadline
    assert failed.finish_reason == "abort" and "prefill result did not complete within 30 s" in failed.error, \
        failed.error
