"""The router's health checks see what a new request would meet (SERVICES §5): each check opens a connection of its
own, so an instance that accepts connections but never answers is unhealthy after 3 checks, each failed at one
interval, and a half-dead one that still answers on a keep-alive connection opened earlier, but serves no new
connection, is unhealthy too. The fake instance is a raw asyncio server in the test's own event loop; the checks
are run round by round (`check_once`), so nothing here is timed: a slow machine makes a round longer, never a
result different."""
from __future__ import annotations

import asyncio

from fastdeploy.router.health import HealthMonitor, health_client
from fastdeploy.router.protocol import Registration
from fastdeploy.router.registry import FAILURES_TO_UNHEALTHY, Registry

INTERVAL_S = 0.5
_OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class FakeInstance:
    """Answers `GET /health` with 200 on every connection accepted while `serving`, keep-alive; a connection
    accepted after `serving` turned False is read and never answered (an instance wedged for new connections)."""

    def __init__(self):
        self.serving, self.connections = True, 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        answers = self.serving
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                if answers:
                    writer.write(_OK)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    async def stop(self) -> None:
        for writer in self._writers:
            writer.close()
        self._server.close()


def _registry(port: int) -> tuple[Registry, str]:
    registry = Registry(3600.0)   # heartbeats expire never here: only the health checks move the instance
    registration = Registration(role="mixed", host="127.0.0.1", port=port, connector_addr=None, model="fd-toy",
                                config_hash="h", max_num_seqs=4, version="1")
    registry.register(registration)
    return registry, registration.key


def _healthy(registry: Registry, key: str) -> bool:
    """The instance's health (it is still registered: unhealthy, not dropped)."""
    (instance,) = [inst for inst in registry.instances() if inst.key == key]
    return instance.healthy


async def _rounds(monitor: HealthMonitor, n: int) -> None:
    for _ in range(n):
        await monitor.check_once()


def test_an_instance_that_accepts_but_never_answers_is_unhealthy_after_three_checks():
    async def run():
        fake = FakeInstance()
        fake.serving = False
        await fake.start()
        registry, key = _registry(fake.port)
        try:
            async with health_client() as client:
                monitor = HealthMonitor(registry, client, INTERVAL_S)
                await _rounds(monitor, FAILURES_TO_UNHEALTHY - 1)
                assert _healthy(registry, key), "unhealthy before 3 failed checks"
                await _rounds(monitor, 1)
                assert not _healthy(registry, key)
        finally:
            await fake.stop()
    asyncio.run(run())


def test_a_stale_keep_alive_connection_does_not_keep_a_half_dead_instance_healthy():
    async def run():
        fake = FakeInstance()
        await fake.start()
        registry, key = _registry(fake.port)
        try:
            async with health_client() as client:
                monitor = HealthMonitor(registry, client, INTERVAL_S)
                await _rounds(monitor, 2)
                assert _healthy(registry, key)
                assert fake.connections == 2, "a health check reused a connection"
                fake.serving = False   # the connections opened so far would still answer
                await _rounds(monitor, FAILURES_TO_UNHEALTHY)
                assert not _healthy(registry, key)
        finally:
            await fake.stop()
    asyncio.run(run())
