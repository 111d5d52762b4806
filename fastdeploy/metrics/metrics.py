"""Exports one instance's Prometheus metrics (SERVICES §4), FastDeploy's names under the prefix `fastdeploy:`.

The API server owns the registry. Load gauges come from the engine core's per-step `EngineStats`, counters and the
per-request histograms from the requests the API server submits and the deltas the core reports (every request,
also those whose client left), the latency histograms from `RequestTracker`, which times a request from its arrival
at the API server. P and D count as FastDeploy's instances do (docs/serving.md "Metrics"): each token once, on the
instance whose model computed it (t0 on P, the rest on D); a request's completion only where it completes (D or a
mixed instance); the prompt and `max_tokens` of a request on every instance it reaches.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fastdeploy.schema.core_protocol import AddRequest, EngineStats, PrefixCacheStats, RequestDelta, StepOutputs
from fastdeploy.schema.request import FINISH_HANDED_OFF
from fastdeploy.metrics.pd_metrics import PDMetrics

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
_STEP_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05, 0.1)
_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
_COMPLETED = ("stop", "length")


class ServerMetrics:
    """`role` is the instance's --splitwise-role: "mixed", "prefill" (P) or "decode" (D)."""

    def __init__(self, role: str = "mixed"):
        self.role = role
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
        self._phase_histograms(p, r)
        self.step_host_seconds = Histogram(p + "step_host_seconds", "Host work of one engine step outside the "
                                           "model's passes (schedule, inputs, state ops, sampling and verification, "
                                           "token processing, outputs)", buckets=_STEP_BUCKETS, registry=r)
        self.requests_number = Counter(p + "requests_number", "Requests received by the engine", registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of the requests the engine accepted",
                                     registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Output tokens this instance's model generated",
                                         registry=r)
        self.request_prompt_tokens = Histogram(p + "request_prompt_tokens", "Prompt tokens per accepted request",
                                               buckets=_COUNT_BUCKETS, registry=r)
        self.request_generation_tokens = Histogram(p + "request_generation_tokens",
                                                   "Output tokens per completed request", buckets=_COUNT_BUCKETS,
                                                   registry=r)
        self.request_params_max_tokens = Histogram(p + "request_params_max_tokens",
                                                   "max_tokens of each accepted request", buckets=_COUNT_BUCKETS,
                                                   registry=r)
        self.request_success = Counter(p + "request_success", "Requests completed", ["finish_reason"], registry=r)
        self.request_aborted = Counter(p + "request_aborted", "Requests that did not complete (finish reason "
                                       "abort: client gone, refused, engine failure)", registry=r)
        self._spec_decode_metrics(p, r)
        self._prefix_cache_metrics(p, r)
        self.pd = PDMetrics(p, r)
        self._submitted: dict[str, tuple[int, int]] = {}   # request id -> (prompt tokens, max_tokens) until accepted
        self._with_tokens: set[str] = set()                # D: live requests whose t0 was reported

    def _phase_histograms(self, p: str, r: CollectorRegistry) -> None:
        """FastDeploy's request phases, as the engine core saw them (RequestDelta)."""
        self.request_queue_time = Histogram(p + "request_queue_time_seconds",
                                            "Time in the WAITING phase: arrival at the engine to a slot",
                                            buckets=_LATENCY_BUCKETS, registry=r)
        self.request_prefill_time = Histogram(p + "request_prefill_time_seconds",
                                              "Time in the prefill phase: slot to first output token",
                                              buckets=_LATENCY_BUCKETS, registry=r)
        self.request_decode_time = Histogram(p + "request_decode_time_seconds",
                                             "Time in the decode phase: first output token to the finish",
                                             buckets=_LATENCY_BUCKETS, registry=r)
        self.request_inference_time = Histogram(p + "request_inference_time_seconds",
                                                "Time in the RUNNING phase: slot to the finish",
                                                buckets=_LATENCY_BUCKETS, registry=r)

    def _spec_decode_metrics(self, p: str, r: CollectorRegistry) -> None:
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

    def _prefix_cache_metrics(self, p: str, r: CollectorRegistry) -> None:
        """FastDeploy's prefix-cache metrics (one KV tier here: the instance's block pool is the "gpu" cache) and
        vLLM's queries / hits token counters, from the engine's cumulative lookups at first admission."""
        self.hit_req_rate = Gauge(p + "hit_req_rate", "Requests with a prefix-cache hit / requests looked up",
                                  registry=r)
        self.hit_token_rate = Gauge(p + "hit_token_rate", "Prompt tokens from the prefix cache / prompt tokens "
                                    "looked up", registry=r)
        self.gpu_hit_token_rate = Gauge(p + "gpu_hit_token_rate", "Prompt tokens from the device KV cache / prompt "
                                        "tokens looked up (the only tier: equals hit_token_rate)", registry=r)
        self.prefix_cache_token_num = Counter(p + "prefix_cache_token_num", "Prompt tokens whose KV came from the "
                                              "prefix cache", registry=r)
        self.prefix_gpu_cache_token_num = Counter(p + "prefix_gpu_cache_token_num", "Prompt tokens whose KV came "
                                                  "from the device KV cache", registry=r)
        self.prefix_cache_queries = Counter(p + "prefix_cache_queries", "Prompt tokens looked up in the prefix "
                                            "cache (vLLM's prefix_cache_queries)", registry=r)
        self.prefix_cache_hits = Counter(p + "prefix_cache_hits", "Prompt tokens found in the prefix cache "
                                         "(vLLM's prefix_cache_hits)", registry=r)
        self.prefix_cached_blocks = Gauge(p + "prefix_cached_blocks", "KV blocks the prefix cache names",
                                          registry=r)
        self._prefix_seen = PrefixCacheStats(0, 0, 0, 0, 0)

    def _set_prefix_cache(self, stats: PrefixCacheStats) -> None:
        """Counters move by what the engine's cumulative figures grew since the last report (a restarted core
        starts again from zero)."""
        seen = self._prefix_seen if stats.query_tokens >= self._prefix_seen.query_tokens else \
            PrefixCacheStats(0, 0, 0, 0, 0)
        hits = stats.hit_tokens - seen.hit_tokens
        self.prefix_cache_queries.inc(stats.query_tokens - seen.query_tokens)
        self.prefix_cache_hits.inc(hits)
        self.prefix_cache_token_num.inc(hits)
        self.prefix_gpu_cache_token_num.inc(hits)
        if stats.requests:
            self.hit_req_rate.set(stats.hit_requests / stats.requests)
        if stats.query_tokens:
            self.hit_token_rate.set(stats.hit_tokens / stats.query_tokens)
            self.gpu_hit_token_rate.set(stats.hit_tokens / stats.query_tokens)
        self.prefix_cached_blocks.set(stats.cached_blocks)
        self._prefix_seen = stats

    def on_submit(self, message: AddRequest) -> None:
        """A request sent to the engine core (FastDeploy's `requests_number`: received by the engine)."""
        self.requests_number.inc()
        self._submitted[message.request_id] = (len(message.prompt_token_ids),
                                               int(message.params.get("max_tokens", 0)))

    def on_outputs(self, outputs: StepOutputs) -> None:
        """Counters come from the engine's deltas, so a request whose client left is still counted."""
        self.set_stats(outputs.stats)
        for seconds in outputs.step_host_seconds:
            self.step_host_seconds.observe(seconds)
        for delta in outputs.deltas:
            submitted = self._submitted.pop(delta.request_id, None)
            if submitted is not None and not delta.rejected:    # the engine's first word on it: accepted
                self._count_accepted(*submitted)
            self.generation_tokens.inc(self._generated(delta))
            if delta.finished:
                self._count_finished(delta)

    def forget_submitted(self) -> None:
        """The engine core is gone: requests it never acknowledged will not be."""
        self._submitted.clear()

    def _count_accepted(self, prompt_tokens: int, max_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_params_max_tokens.observe(max_tokens)

    def _generated(self, delta: RequestDelta) -> int:
        """Tokens of this delta that this instance's model computed: on D the request's first token is P's t0,
        which arrives with the hand-off, so it is P's (FastDeploy counts it there too)."""
        count = len(delta.new_token_ids)
        if self.role == "decode" and count and delta.request_id not in self._with_tokens:
            self._with_tokens.add(delta.request_id)
            count -= 1
        return count

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
            self.pd.update(stats.pd)
        if stats.prefix_cache is not None:
            self._set_prefix_cache(stats.prefix_cache)

    def track(self) -> RequestTracker:
        return RequestTracker(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _count_finished(self, delta: RequestDelta) -> None:
        self._with_tokens.discard(delta.request_id)
        if delta.rejected:
            self.request_aborted.inc()
            return
        self._observe_phases(delta)
        if delta.finish_reason == FINISH_HANDED_OFF:   # P's part is done; the request completes on D
            return
        if delta.finish_reason not in _COMPLETED:
            self.request_aborted.inc()
            return
        self.request_success.labels(finish_reason=delta.finish_reason).inc()
        self.request_generation_tokens.observe(delta.num_output_tokens)
        self.spec_decode_num_draft_tokens.inc(delta.num_draft_tokens)
        self.spec_decode_num_accepted_tokens.inc(delta.num_accepted_drafts)
        self.spec_decode_num_emitted_tokens.inc(delta.num_accepted_drafts + delta.num_decode_rounds)
        self._drafts += delta.num_draft_tokens
        self._accepted += delta.num_accepted_drafts
        if self._drafts:
            self.spec_decode_draft_acceptance_rate.set(self._accepted / self._drafts)

    def _observe_phases(self, delta: RequestDelta) -> None:
        """P observes the phases up to its first token (queue, prefill); D and mixed instances all four, for the
        requests that completed."""
        phases = [(self.request_queue_time, delta.queue_time_s), (self.request_prefill_time, delta.prefill_time_s)]
        if delta.finish_reason in _COMPLETED:
            phases += [(self.request_decode_time, delta.decode_time_s),
                       (self.request_inference_time, delta.inference_time_s)]
        elif delta.finish_reason != FINISH_HANDED_OFF:
            return
        for histogram, seconds in phases:
            if seconds is not None:
                histogram.observe(seconds)

    def observe_latencies(self, delta: RequestDelta, ttft: float | None, e2e: float) -> None:
        """Latency histograms of a request that completed (finish reason stop or length); on P, the time to its
        first token t0 once handed off."""
        if delta.finish_reason == FINISH_HANDED_OFF:
            if ttft is not None:
                self.time_to_first_token.observe(ttft)
            return
        if delta.finish_reason not in _COMPLETED:
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
