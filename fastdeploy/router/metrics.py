"""The router's Prometheus metrics: requests per instance, health and load per instance, refusals and failures.

Names use the prefix ``fastdeploy_router:`` so that they never collide with an instance's ``fastdeploy:``
metrics when both are scraped into one Prometheus. Per-instance gauges are read from the registry at scrape time,
so a dropped instance disappears from them without any label clean-up.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from .registry import Registry


class _RegistryCollector:
    """Exports the registry's current state as gauges at each scrape."""

    def __init__(self, registry: Registry):
        self._registry = registry

    def describe(self):
        return []

    def collect(self):
        healthy = GaugeMetricFamily("fastdeploy_router:instance_healthy",
                                    "1 if the instance gets new requests, 0 if unhealthy",
                                    labels=["instance", "role", "config_hash"])
        outstanding = GaugeMetricFamily("fastdeploy_router:instance_outstanding_requests",
                                        "requests sent to the instance and not yet answered in full",
                                        labels=["instance", "role"])
        prefill_work = GaugeMetricFamily("fastdeploy_router:instance_outstanding_prefill_work",
                                         "prefill instances: prompt size (token ids or characters) of the "
                                         "requests sent and not yet handed off", labels=["instance", "role"])
        capacity = GaugeMetricFamily("fastdeploy_router:instance_free_capacity",
                                     "requests the instance can take now: free slots, fewer when its last "
                                     "heartbeat reported fewer free KV blocks than those slots' share",
                                     labels=["instance", "role"])
        for inst in self._registry.instances():
            healthy.add_metric([inst.key, inst.role, inst.registration.config_hash], 1.0 if inst.healthy else 0.0)
            outstanding.add_metric([inst.key, inst.role], float(inst.outstanding))
            prefill_work.add_metric([inst.key, inst.role], float(inst.outstanding_prefill_work))
            capacity.add_metric([inst.key, inst.role], float(inst.free_capacity))
        yield from (healthy, outstanding, prefill_work, capacity)


class RouterMetrics:
    """The counters the forwarding code increments, plus the registry gauges, in one prometheus registry."""

    def __init__(self, registry: Registry):
        self.prometheus = CollectorRegistry()
        self.prometheus.register(_RegistryCollector(registry))
        self.requests = Counter("fastdeploy_router:requests", "requests forwarded, per instance",
                                ["instance", "role"], registry=self.prometheus)
        self.refused = Counter("fastdeploy_router:refused_requests",
                               "requests the router answered itself, by reason",
                               ["reason"], registry=self.prometheus)
        self.upstream_failures = Counter("fastdeploy_router:upstream_failures",
                                         "forwarded requests that failed at the instance, by kind",
                                         ["instance", "role", "kind"], registry=self.prometheus)
        self.client_disconnects = Counter("fastdeploy_router:client_disconnects",
                                          "requests whose client left before the answer was complete",
                                          registry=self.prometheus)
