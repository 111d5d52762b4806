"""The router's watch over a request in flight (fastdeploy/router/forward.py `Forwarder._watch`, SERVICES §6
"Across hosts"): a request whose instance has been out of service for 3 health intervals and whose answer has been
silent as long ends as "lost"; one whose instance is out of service yet still sending, or back in service within
3 intervals, or healthy and merely slow, is left alone. Driven in-process with a registry and a stand-in upstream;
waits are counted in health intervals."""
from __future__ import annotations

import asyncio

from fastdeploy.router.forward import Forwarder
from fastdeploy.router.protocol import Registration
from fastdeploy.router.registry import FAILURES_TO_UNHEALTHY, Registry

INTERVAL_S = 0.02


class StandInUpstream:
    """What `_watch` reads and calls of an Upstream."""

    def __init__(self):
        self.last_data_at = asyncio.get_running_loop().time()
        self.lost: str | None = None

    def lose(self, detail: str) -> None:
        self.lost = detail

    def send(self) -> None:
        self.last_data_at = asyncio.get_running_loop().time()


def _registry() -> tuple[Registry, object]:
    registry = Registry(60.0)    # heartbeats never expire here: health alone moves the instance
    registry.register(Registration(role="decode", host="10.241.0.3", port=8180, connector_addr="10.241.0.3:8191",
                                   model="m", config_hash="h", max_num_seqs=1, version="t"))
    return registry, registry.instances()[0]


def _out_of_service(registry: Registry, key: str) -> None:
    for _ in range(FAILURES_TO_UNHEALTHY):
        registry.record_health(key, False)


async def _watch_for(intervals: int, step) -> StandInUpstream:
    """Runs the watch for at most `intervals` health intervals, calling `step(i, registry, instance, upstream)`
    each interval; returns the upstream (its `lost` set if the watch ended it)."""
    registry, instance = _registry()
    upstream = StandInUpstream()
    forwarder = Forwarder(registry, None, None, 600.0, health_interval_secs=INTERVAL_S)
    watch = asyncio.create_task(forwarder._watch(instance, upstream))
    for i in range(intervals):
        step(i, registry, instance, upstream)
        await asyncio.sleep(INTERVAL_S)
        if watch.done():
            break
    watch.cancel()
    return upstream


def test_out_of_service_and_silent_is_lost():
    def step(i, registry, instance, upstream):
        if i == 0:
            _out_of_service(registry, instance.key)
    upstream = asyncio.run(_watch_for(500, step))
    assert upstream.lost is not None and "stopped answering" in upstream.lost


def test_out_of_service_but_sending_is_kept():
    def step(i, registry, instance, upstream):
        if i == 0:
            _out_of_service(registry, instance.key)
        upstream.send()
    assert asyncio.run(_watch_for(8 * FAILURES_TO_UNHEALTHY, step)).lost is None


def test_healthy_and_silent_is_kept():
    assert asyncio.run(_watch_for(8 * FAILURES_TO_UNHEALTHY, lambda *_: None)).lost is None


def test_back_in_service_within_the_patience_is_kept():
    """Out of service for one interval in four (a stall of the router's host), silent throughout: each watch turn
    in the three others sees it back, so it is never out for 3 intervals in a row."""
    def step(i, registry, instance, upstream):
        if i % 4 == 0:
            _out_of_service(registry, instance.key)
        else:
            instance.healthy = True
    assert asyncio.run(_watch_for(8 * FAILURES_TO_UNHEALTHY, step)).lost is None
