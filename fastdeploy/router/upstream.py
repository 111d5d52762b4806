"""One HTTP request from the router to one instance, run in its own task so that cancelling it closes the
connection (the abort signal an instance acts on, SERVICES §6) and every failure arrives as one error type."""
from __future__ import annotations

import asyncio

import httpx

# Chunks buffered between the instance and a slow client before the router stops reading (back-pressure).
QUEUE_CHUNKS = 64
_END = object()


class UpstreamError(Exception):
    """The instance could not be reached ("connect"), broke the response off ("broken"), passed the request
    deadline ("timeout"), was lost while its answer was silent ("lost": the router's health checks found it
    unhealthy or dropped it, e.g. a partition or a host gone), or the router closed the request itself
    ("cancelled")."""

    def __init__(self, instance_key: str, kind: str, detail: str):
        super().__init__(f"instance {instance_key}: {kind}: {detail}")
        self.instance_key, self.kind, self.detail = instance_key, kind, detail


class Upstream:
    """Sends ``body`` to ``url`` and hands over the response head, then its raw body chunks, until cancelled."""

    def __init__(self, client: httpx.AsyncClient, instance_key: str, url: str, body: bytes,
                 headers: dict[str, str], deadline: float):
        self.instance_key = instance_key
        self.response: httpx.Response | None = None
        self.error: UpstreamError | None = None
        self._head = asyncio.Event()
        self._chunks: asyncio.Queue = asyncio.Queue(maxsize=QUEUE_CHUNKS)
        self._lost: str | None = None
        self.last_data_at = asyncio.get_running_loop().time()   # when the head or the latest chunk came
        request = client.build_request("POST", url, content=body, headers=headers)
        self.task = asyncio.create_task(self._run(client, request, deadline))

    async def head(self) -> httpx.Response:
        """The response status and headers; raises UpstreamError when none came."""
        await self._head.wait()
        if self.response is None:
            raise self.error
        return self.response

    async def next_chunk(self) -> bytes | None:
        """The next raw body chunk, None at the end; raises UpstreamError if the body broke off."""
        item = await self._chunks.get()
        if item is _END:
            if self.error is not None:
                raise self.error
            return None
        return item

    async def read_all(self) -> bytes:
        """The whole body; raises UpstreamError if it broke off."""
        await self.head()
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    def cancel(self) -> None:
        """Closes the connection (the instance sees its client go and aborts the request)."""
        self.task.cancel()

    def lose(self, detail: str) -> None:
        """Ends the request as "lost" (`detail` says why): its reader gets that error instead of waiting on."""
        self._lost = detail
        self.task.cancel()

    async def _run(self, client: httpx.AsyncClient, request: httpx.Request, deadline: float) -> None:
        response = None
        try:
            async with asyncio.timeout_at(deadline):
                response = await client.send(request, stream=True)
                self.response = response
                self.last_data_at = asyncio.get_running_loop().time()
                self._head.set()
                async for chunk in response.aiter_raw():
                    self.last_data_at = asyncio.get_running_loop().time()
                    await self._chunks.put(chunk)
        except asyncio.CancelledError:
            if self._lost is not None:   # not re-raised: the reader is waiting for the error
                self.error = UpstreamError(self.instance_key, "lost", self._lost)
            else:
                self.error = UpstreamError(self.instance_key, "cancelled", "closed by the router")
                raise
        except TimeoutError:
            self.error = UpstreamError(self.instance_key, "timeout", "no complete answer within the request timeout")
        except httpx.ConnectError as exc:
            self.error = UpstreamError(self.instance_key, "connect", str(exc) or type(exc).__name__)
        except (httpx.HTTPError, OSError) as exc:
            self.error = UpstreamError(self.instance_key, "broken", str(exc) or type(exc).__name__)
        finally:
            self._head.set()
            if response is not None:
                await response.aclose()
            if self.error is not None and self.error.kind in ("cancelled", "lost"):
                self._end_now()
        # Outside the deadline: a consumer either reads this marker or cancels the task.
        await self._chunks.put(_END)

    def _end_now(self) -> None:
        """Ends the chunk stream at once for anyone still reading it; unread chunks of a cancelled request are
        worthless."""
        while not self._chunks.empty():
            self._chunks.get_nowait()
        self._chunks.put_nowait(_END)
