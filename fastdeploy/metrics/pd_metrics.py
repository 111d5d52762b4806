"""Exports the PD connector's metrics of one instance (SERVICES §4) from the cumulative counts its engine reports.

P reports hand-offs sent, KV bytes sent, the hand-offs it gave up sending (FastDeploy's `send_cache_failed_num`),
its connector's refusals, the transport calls that raised (each failed its request), the blocks it holds until D
acknowledges and its writes in flight from staging (Mooncake); D reports hand-offs received, KV bytes received,
refusals and the reservation-to-receipt latencies since its previous report (`pd_counters()` of each half). The
engine's counts are cumulative, so each Prometheus counter advances by the difference.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class PDMetrics:
    def __init__(self, prefix: str, registry: CollectorRegistry):
        p, r = prefix, registry
        self.handoffs = Counter(p + "pd_handoffs", "P->D hand-offs sent (P) or received (D)", ["direction"],
                                registry=r)
        self.kv_bytes = Counter(p + "pd_kv_bytes", "KV bytes moved by hand-offs", ["direction"], registry=r)
        self.refused = Counter(p + "pd_messages_refused", "PD connector messages and hand-offs refused, by reason",
                               ["reason"], registry=r)
        self.held_blocks = Gauge(p + "pd_held_kv_blocks", "KV blocks the resource manager keeps for a transfer under "
                                 "finished requests: D's in quarantine while P may still write into them (Mooncake)",
                                 registry=r)
        self.staged_writes = Gauge(p + "pd_staged_writes", "P's one-sided writes (Mooncake) in flight from its "
                                   "staging pool: each holds a staging slot, not KV blocks", registry=r)
        self.handoff_latency = Histogram(p + "pd_handoff_latency_seconds",
                                         "D's reservation to the hand-off's receipt", buckets=_LATENCY_BUCKETS,
                                         registry=r)
        self.transport_errors = Counter(p + "pd_transport_errors", "PD connector transport calls that raised (each "
                                        "failed its request, never the engine step)", registry=r)
        self.send_cache_failed = Counter(p + "send_cache_failed_num",
                                         "Hand-offs P gave up sending to D (KV transfer deadline)", registry=r)
        self._seen: dict[tuple[str, str], int] = {}

    def update(self, pd: dict) -> None:
        for key, counter in (("handoffs_sent", self.handoffs.labels(direction="sent")),
                             ("handoffs_received", self.handoffs.labels(direction="received")),
                             ("kv_bytes_sent", self.kv_bytes.labels(direction="sent")),
                             ("kv_bytes_received", self.kv_bytes.labels(direction="received")),
                             ("send_failed", self.send_cache_failed),
                             ("transport_errors", self.transport_errors)):
            if key in pd:
                self._advance(counter, key, "", pd[key])
        for reason, count in pd.get("refused", {}).items():
            self._advance(self.refused.labels(reason=reason), "refused", reason, count)
        if "held_blocks" in pd:
            self.held_blocks.set(pd["held_blocks"])
        if "staged_writes" in pd:
            self.staged_writes.set(pd["staged_writes"])
        for seconds in pd.get("handoff_latency_s", ()):
            self.handoff_latency.observe(seconds)

    def _advance(self, counter, key: str, label: str, total: int) -> None:
        seen = self._seen.get((key, label), 0)
        if total > seen:
            counter.inc(total - seen)
        self._seen[(key, label)] = total
