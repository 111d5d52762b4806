"""The registration heartbeat (entrypoints/openai/registration.py, SERVICES §5) never fails on a healthy router
because the router closed an idle connection: a router (uvicorn) closes a kept-alive connection after 5 s idle,
the heartbeat's period, so a heartbeat sent on a pooled connection met that close now and then (a `ReadError`,
the instance logged the router unreachable and re-registered). Each heartbeat opens its own
connection. The router here is a bare HTTP/1.1 server that answers the first request of every connection with
keep-alive and closes the connection when a second request arrives on it: the race made certain."""
from __future__ import annotations

import asyncio
import logging

from fastdeploy.entrypoints.openai.registration import keep_registered

HEARTBEATS = 4


async def _closing_router(answered: list[int]) -> asyncio.AbstractServer:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                if served:   # the idle connection's close crosses this request
                    break
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
                             b"connection: keep-alive\r\n\r\n{}")
                await writer.drain()
                served += 1
                answered.append(1)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(connection, "127.0.0.1", 0)


def test_heartbeats_survive_a_router_that_closes_idle_connections(caplog):
    """Four heartbeats in a row to a router that closes each connection after one answer: every one is answered
    and the instance never logs the router as refused or unreachable."""
    async def scenario() -> list[int]:
        answered: list[int] = []
        server = await _closing_router(answered)
        port = server.sockets[0].getsockname()[1]
        body = {"role": "mixed", "host": "127.0.0.1", "port": 1}
        task = asyncio.create_task(keep_registered(f"127.0.0.1:{port}", body, 0.01))
        try:
            for _ in range(2000):   # bounded: only turns a hang into a failure
                if len(answered) >= HEARTBEATS or task.done():
                    break
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            server.close()
            await server.wait_closed()
        return answered

    with caplog.at_level(logging.INFO, logger="fastdeploy.api_server"):
        answered = asyncio.run(scenario())
    assert len(answered) >= HEARTBEATS
    assert "registered: with router" in caplog.text
    assert "refused or unreachable" not in caplog.text, caplog.text
