"""ServerMetrics from synthetic engine reports (docs/serving.md "Metrics"): what each role counts for a request's
submission, deltas and finish, by value, without any process."""
from __future__ import annotations

from msgspec.structs import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fastdeploy.schema.core_protocol import AddRequest, EngineStats, RequestDelta, StepOutputs
from fastdeploy.metrics.metrics import ServerMetrics

STATS = EngineStats(num_running=0, num_waiting=0, free_slots=2, total_slots=2, free_kv_blocks=8, total_kv_blocks=8)
P = "fastdeploy:"


def samples(metrics: ServerMetrics) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "le")
            if "le" not in s.labels:
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def feed(metrics: ServerMetrics, *deltas: RequestDelta) -> None:
    for delta in deltas:
        metrics.on_outputs(StepOutputs(deltas=[delta], stats=STATS))


def submit(metrics: ServerMetrics, rid: str, prompt_len: int, max_tokens: int) -> None:
    metrics.on_submit(AddRequest(request_id=rid, prompt_token_ids=list(range(prompt_len)),
                                 params={"max_tokens": max_tokens}))


def finished(rid: str, tokens: list[int], reason: str, prompt_len: int, total: int, **extra) -> RequestDelta:
    return RequestDelta(request_id=rid, new_token_ids=tokens, finished=True, finish_reason=reason,
                        num_prompt_tokens=prompt_len, num_output_tokens=total, queue_time_s=0.1,
                        prefill_time_s=0.2, decode_time_s=0.3, inference_time_s=0.5, **extra)


@pytest.mark.parametrize("role, generated", [("mixed", 5), ("decode", 4)])
def test_a_completed_request(role, generated):
    """mixed counts every token it generated; D all but t0, which P computed. Both count the completion."""
    metrics = ServerMetrics(role)
    submit(metrics, "r", 7, 16)
    feed(metrics, RequestDelta("r", []), RequestDelta("r", [10, 11]), RequestDelta("r", [12]),
         finished("r", [13, 14], "length", 7, 5, num_decode_rounds=3, num_draft_tokens=3, num_accepted_drafts=1))
    m = samples(metrics)
    assert m[P + "requests_number_total"] == 1
    assert m[P + "prompt_tokens_total"] == 7
    assert m[P + "generation_tokens_total"] == generated
    assert m[P + "request_success_total{finish_reason=length}"] == 1
    assert m[P + "request_aborted_total"] == 0
    assert (m[P + "request_generation_tokens_count"], m[P + "request_generation_tokens_sum"]) == (1, 5)
    assert (m[P + "request_params_max_tokens_count"], m[P + "request_params_max_tokens_sum"]) == (1, 16)
    assert (m[P + "request_prompt_tokens_count"], m[P + "request_prompt_tokens_sum"]) == (1, 7)
    for name, seconds in (("queue", 0.1), ("prefill", 0.2), ("decode", 0.3), ("inference", 0.5)):
        assert (m[f"{P}request_{name}_time_seconds_count"], m[f"{P}request_{name}_time_seconds_sum"]) == (1, seconds)
    assert m[P + "spec_decode_num_emitted_tokens_total"] == 4
    assert m[P + "spec_decode_draft_acceptance_rate"] == pytest.approx(1 / 3)


def test_prefill_hand_off_is_neither_success_nor_abort():
    """P: t0 generated, prompt counted, the phases up to t0 observed; no completion, no abort."""
    metrics = ServerMetrics("prefill")
    submit(metrics, "r", 9, 32)
    feed(metrics, RequestDelta("r", []), finished("r", [42], "handed_off", 9, 1))
    m = samples(metrics)
    assert (m[P + "requests_number_total"], m[P + "prompt_tokens_total"], m[P + "generation_tokens_total"]) == (
        1, 9, 1)
    assert m[P + "request_aborted_total"] == 0
    assert not [name for name in m if name.startswith(P + "request_success_total")]
    assert (m[P + "request_queue_time_seconds_count"], m[P + "request_prefill_time_seconds_count"]) == (1, 1)
    assert (m[P + "request_decode_time_seconds_count"], m[P + "request_inference_time_seconds_count"]) == (0, 0)
    assert m[P + "request_generation_tokens_count"] == 0


def test_refused_and_aborted_requests():
    """A request the engine refuses was received (requests_number) and aborted, its prompt not processed; one
    aborted after tokens counts its tokens and the abort, no completion and no completion histograms."""
    metrics = ServerMetrics("mixed")
    submit(metrics, "refused", 5, 999)
    submit(metrics, "gone", 3, 10)
    feed(metrics, RequestDelta("refused", [], finished=True, finish_reason="abort", error="too long", rejected=True,
                               num_prompt_tokens=5),
         RequestDelta("gone", [1, 2]), finished("gone", [3], "abort", 3, 3))
    m = samples(metrics)
    assert m[P + "requests_number_total"] == 2
    assert (m[P + "prompt_tokens_total"], m[P + "request_prompt_tokens_count"]) == (3, 1)
    assert m[P + "generation_tokens_total"] == 3
    assert m[P + "request_aborted_total"] == 2
    assert m[P + "request_generation_tokens_count"] == 0 and m[P + "request_decode_time_seconds_count"] == 0


def test_send_failures_advance_by_the_engine_counts():
    metrics = ServerMetrics("prefill")
    for failed in (0, 2, 2, 3):
        metrics.set_stats(replace(STATS, pd={"send_failed": failed, "handoffs_sent": 1}))
    assert samples(metrics)[P + "send_cache_failed_num_total"] == 3


def test_prefix_cache_metrics_follow_the_engine_counts_across_a_core_restart():
    from fastdeploy.schema.core_protocol import PrefixCacheStats

    metrics = ServerMetrics()
    reports = [PrefixCacheStats(1, 0, 10, 0, 2), PrefixCacheStats(3, 2, 30, 16, 2),
               PrefixCacheStats(1, 1, 10, 8, 1)]            # the last after a restarted engine core
    for report in reports:
        metrics.set_stats(replace(STATS, prefix_cache=report))
    s = samples(metrics)
    assert s[P + "prefix_cache_queries_total"] == 40 and s[P + "prefix_cache_hits_total"] == 24
    assert s[P + "prefix_cache_token_num_total"] == s[P + "prefix_gpu_cache_token_num_total"] == 24
    assert (s[P + "hit_req_rate"], s[P + "hit_token_rate"], s[P + "gpu_hit_token_rate"]) == (1.0, 0.8, 0.8)
    assert s[P + "prefix_cached_blocks"] == 1
