"""The health monitor: every interval it drops silent instances and polls each instance's ``GET /health``.

Each check opens a connection of its own (`health_client`: no keep-alive, ``Connection: close``), never one of the
forwarding pool's: an instance that no longer accepts or serves new connections would otherwise look alive
through a keep-alive connection it opened earlier, and a check must see what a new request would meet
(SERVICES §5)."""
from __future__ import annotations

import asyncio
import logging

import httpx

from .registry import MISSED_HEARTBEATS_TO_DROP, Instance, Registry

log = logging.getLogger("fastdeploy.router")


def health_client() -> httpx.AsyncClient:
    """The health monitor's own HTTP client: one fresh connection per check, closed after its answer."""
    return httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0), headers={"connection": "close"})


class HealthMonitor:
    """Feeds the registry's hysteresis (SERVICES §5) from ``/health`` answers; only 200 counts as a success."""

    def __init__(self, registry: Registry, client: httpx.AsyncClient, interval: float):
        """`client` is `health_client()`'s (a pooled client would let a stale connection answer for a dead
        instance)."""
        self._registry = registry
        self._client = client
        self._interval = interval

    async def run(self) -> None:
        """Checks forever, one round per interval; cancel the task to stop it."""
        while True:
            await self.check_once()
            await asyncio.sleep(self._interval)

    async def check_once(self) -> None:
        for inst in self._registry.drop_expired():
            log.info("instance dropped: %s (%s), no heartbeat for %d intervals", inst.key, inst.role,
                     MISSED_HEARTBEATS_TO_DROP)
        instances = self._registry.instances()
        results = await asyncio.gather(*(self._probe(inst) for inst in instances))
        for inst, ok in zip(instances, results):
            change = self._registry.record_health(inst.key, ok)
            if change is not None:
                log.info("instance %s: %s (%s)", change, inst.key, inst.role)

    async def _probe(self, inst: Instance) -> bool:
        # A check slower than one interval counts as failed (connect included): the next round is due.
        try:
            response = await self._client.get(f"{inst.url}/health", timeout=self._interval)
        except httpx.HTTPError:
            return False
        return response.status_code == 200
