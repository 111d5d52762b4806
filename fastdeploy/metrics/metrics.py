"""Exports one instance's Prometheus metrics (SERVICES §4), FastDeploy's names under the prefix `fastdeploy:`.

The API server owns the registry. Load gauges come from the engine core's per-step `EngineStats`, counters from
the request deltas the core reports (every request, also those whose client left), latency histograms from
`RequestTracker`, which times a request from its arrival at the API server.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fastdeploy.schema.core_protocol import EngineStats, RequestDelta, StepOutputs

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class ServerMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        p = "fastdeploy:"
        self.num_requests_running = Gauge(p + "num_requests_running", "Requests holding a slot", registry=r)
        self.num_requests_waiting = Gauge(p + "num_requests_waiting", "Requests queued for a slot", registry=r)
        self.gpu_cache_usage_perc = Gauge(p + "gpu_cache_usage_perc", "Fraction of KV blocks in use (0..1)",
                                          registry=r)
        self.free_kv_blocks = Gauge(p + "free_kv_blocks", "KV blocks free", registry=r)
        self.total_kv_blocks = Gauge(p + "total_kv_blocks", "KV blocks in the pool", registry=r)
        self.free_slots = Gauge(p + "free_slots", "Request slots free", registry=r)
        self.total_slots = Gauge(p + "total_slots", "Request slots (max_num_seqs)", registry=r)
        self.time_to_first_token = Histogram(p + "time_to_first_token_seconds", "Arrival to first output token",
                                             buckets=_LATENCY_BUCKETS, registry=r)
        self.time_per_output_token = Histogram(p + "time_per_output_token_seconds",
                                               "Mean time per output token after the first, per request",
                                               buckets=_TOKEN_BUCKETS, registry=r)
        self.e2e_request_latency = Histogram(p + "e2e_request_latency_seconds", "Arrival to last output token",
                                             buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Output tokens generated", registry=r)
        self.request_success = Counter(p + "request_success", "Requests completed", ["finish_reason"], registry=r)
        self.request_aborted = Counter(p + "request_aborted", "Requests that did not complete (finish reason "
                                       "abort: client gone, refused, engine failure)", registry=r)
        self.spec_decode_draft_acceptance_rate = Gauge(p + "spec_decode_draft_acceptance_rate",
                                                       "Accepted drafts / drafts verified, since start", registry=r)
        self.spec_decode_num_accepted_tokens = Counter(p + "spec_decode_num_accepted_tokens",
                                                       "Draft tokens accepted", registry=r)
        self.spec_decode_num_draft_tokens = Counter(p + "spec_decode_num_draft_tokens", "Draft tokens verified",
                                                    registry=r)
        self.spec_decode_num_emitted_tokens = Counter(p + "spec_decode_num_emitted_tokens",
                                                      "Tokens emitted by decode rounds (accepted drafts + one per "
                                                      "round)", registry=r)
        self._drafts = self._accepted = 0
        # PD (SERVICES §4): the engine reports cumulative counts; the counters advance by the difference.
        self.pd_handoffs = Counter(p + "pd_handoffs", "P->D hand-offs sent (P) or received (D)", ["direction"],
                                   registry=r)
        self.pd_kv_bytes = Counter(p + "pd_kv_bytes", "KV bytes moved by hand-offs", ["direction"], registry=r)
        self.pd_refused = Counter(p + "pd_refused", "Connector messages or hand-offs refused", ["reason"],
                                  registry=r)
        self.pd_held_blocks = Gauge(p + "pd_held_kv_blocks", "P's KV blocks held until D acknowledges",
                                    registry=r)
        self.pd_handoff_latency = Histogram(p + "pd_handoff_latency_seconds",
                                            "D's reservation to the hand-off's receipt", buckets=_LATENCY_BUCKETS,
                                            registry=r)
        self._pd_seen: dict[tuple[str, str], int] = {}

    def on_outputs(self, outputs: StepOutputs) -> None:
        """Counters come from the engine's deltas, so a request whose client left is still counted."""
        self.set_stats(outputs.stats)
        for delta in outputs.deltas:
            if delta.new_token_ids:
                self.generation_tokens.inc(len(delta.new_token_ids))
            if delta.finished:
                self._count_finished(delta)

    def set_stats(self, stats: EngineStats) -> None:
        self.num_requests_running.set(stats.num_running)
        self.num_requests_waiting.set(stats.num_waiting)
        self.free_kv_blocks.set(stats.free_kv_blocks)
        self.total_kv_blocks.set(stats.total_kv_blocks)
        self.free_slots.set(stats.free_slots)
        self.total_slots.set(stats.total_slots)
        total = stats.total_kv_blocks
        self.gpu_cache_usage_perc.set((total - stats.free_kv_blocks) / total if total else 0.0)
        if stats.pd is not None:
            self._set_pd(stats.pd)

    def _set_pd(self, pd: dict) -> None:
        for key, counter, label in (("handoffs_sent", self.pd_handoffs, "sent"),
                                    ("handoffs_received", self.pd_handoffs, "received"),
                                    ("kv_bytes_sent", self.pd_kv_bytes, "sent"),
                                    ("kv_bytes_received", self.pd_kv_bytes, "received")):
            if key in pd:
                self._advance(counter.labels(direction=label), key, "", pd[key])
        for reason, count in pd.get("refused", {}).items():
            self._advance(self.pd_refused.labels(reason=reason), "refused", reason, count)
        if "held_blocks" in pd:
            self.pd_held_blocks.set(pd["held_blocks"])
        for seconds in pd.get("handoff_latency_s", ()):
            self.pd_handoff_latency.observe(seconds)

    def _advance(self, counter, key: str, label: str, total: int) -> None:
        seen = self._pd_seen.get((key, label), 0)
        if total > seen:
            counter.inc(total - seen)
        self._pd_seen[(key, label)] = total

    def track(self) -> RequestTracker:
        return RequestTracker(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _count_finished(self, delta: RequestDelta) -> None:
        if delta.finish_reason not in ("stop", "length"):
            self.request_aborted.inc()
            return
        self.request_success.labels(finish_reason=delta.finish_reason).inc()
        self.prompt_tokens.inc(delta.num_prompt_tokens)
        self.spec_decode_num_draft_tokens.inc(delta.num_draft_tokens)
        self.spec_decode_num_accepted_tokens.inc(delta.num_accepted_drafts)
        self.spec_decode_num_emitted_tokens.inc(delta.num_accepted_drafts + delta.num_decode_rounds)
        self._drafts += delta.num_draft_tokens
        self._accepted += delta.num_accepted_drafts
        if self._drafts:
            self.spec_decode_draft_acceptance_rate.set(self._accepted / self._drafts)

    def observe_latencies(self, delta: RequestDelta, ttft: float | None, e2e: float) -> None:
        """Latency histograms of a request that completed (finish reason stop or length)."""
        if delta.finish_reason not in ("stop", "length"):
            return
        self.e2e_request_latency.observe(e2e)
        if ttft is not None:
            self.time_to_first_token.observe(ttft)
            if delta.num_output_tokens > 1:
                self.time_per_output_token.observe((e2e - ttft) / (delta.num_output_tokens - 1))


class RequestTracker:
    """Times one request from its arrival at the API server."""

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics
        self.arrival = time.perf_counter()
        self.first_token: float | None = None

    def on_tokens(self, count: int) -> None:
        if count and self.first_token is None:
            self.first_token = time.perf_counter()

    def on_finished(self, delta: RequestDelta) -> None:
        now = time.perf_counter()
        ttft = None if self.first_token is None else self.first_token - self.arrival
        self.metrics.observe_latencies(delta, ttft, now - self.arrival)
