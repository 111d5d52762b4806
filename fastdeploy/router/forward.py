"""Forwarding of one completion request to a mixed instance or to a (P, D) pair, with the answer passed back.

Mixed mode (SERVICES §5): the least loaded healthy mixed instance gets the client's body unchanged; its stream or
JSON comes back unchanged, 4xx included. Splitwise mode (SERVICES §6): the router names the request, sends the
same body plus ``disaggregate_info`` to D and to P at once, and the client gets D's answer; P answers a short
status once it has handed off, and if P fails first, D is aborted and the client gets P's error. Closing an
upstream connection is the abort signal, so a client that leaves closes both. No failure becomes a 500.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from dataclasses import dataclass

import httpx
import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from .errors import error_body, sse_error_event
from .metrics import RouterMetrics
from .registry import FAILURES_TO_UNHEALTHY, Instance, Registry, prompt_size
from .upstream import Upstream, UpstreamError

log = logging.getLogger("fastdeploy.router")

SSE_MEDIA_TYPE = "text/event-stream"
SERVED_BY_HEADER = "x-fastdeploy-served-by"
_FAILURE_STATUS = {"connect": 502, "broken": 502, "timeout": 504, "cancelled": 502, "lost": 502}
# Status for a client that left; nobody receives it, it only marks the access log (nginx's convention).
_CLIENT_CLOSED = 499


@dataclass(slots=True)
class Failure:
    """An error answer for the client: HTTP status and OpenAI error body (and the connection refusal it comes
    from, when the instance could not be reached)."""

    status: int
    body: dict
    refused: UpstreamError | None = None


@dataclass(slots=True)
class Refused:
    """The chosen instance (P when `prefill`) refused the connection before anything was answered: the request
    can go to another healthy instance."""

    error: UpstreamError
    prefill: bool = False


class PrefillFailed(Exception):
    """P answered an error (or could not be reached) before D's answer was complete."""

    def __init__(self, failure: Failure):
        super().__init__(failure.body["error"]["message"])
        self.failure = failure


class ClientGone(Exception):
    """The client disconnected while the router waited on an instance."""


class ClientWatch:
    """Notices the client disconnecting during the phases where no response is being streamed yet."""

    def __init__(self, request: Request):
        self.task = asyncio.create_task(self._wait(request))

    @staticmethod
    async def _wait(request: Request) -> None:
        # The body is already read, so the server's receive() now only ever reports the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass

    def stop(self) -> None:
        self.task.cancel()


@dataclass(slots=True)
class RelayState:
    """How a relayed stream ended: "done", "failed", or None while running and when the client left."""

    outcome: str | None = None


class RelayResponse(StreamingResponse):
    """A StreamingResponse that always runs ``on_close`` after the stream, however it ended.

    Starlette only cancels the sending task when the client leaves; a generator suspended at a ``yield`` (or
    never started) would keep its upstream open until garbage collection, so the clean-up lives here.
    """

    def __init__(self, content, on_close, **kwargs):
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            self._on_close()


def with_field(raw: bytes, name: str, value) -> bytes:
    """The client's JSON object `raw` with one more field, spliced in as text: the body is not re-encoded, so it
    reaches the instances as the client wrote it (however deep; the router's parse already checked it) and costs
    no second serialisation. The router refuses bodies that set `name` themselves."""
    inner = raw.rstrip()[:-1].rstrip()   # the object without its closing brace
    separator = b"" if inner.endswith(b"{") else b","
    return inner + separator + orjson.dumps(name) + b":" + orjson.dumps(value) + b"}"


def request_id_for(path: str) -> str:
    """The id the router gives a PD request: ``chatcmpl-<hex>`` for chat, ``cmpl-<hex>`` otherwise."""
    return f"{'chatcmpl' if path.endswith('/chat/completions') else 'cmpl'}-{uuid.uuid4().hex}"


def _streams(response: httpx.Response) -> bool:
    return response.status_code == 200 and response.headers.get("content-type", "").startswith(SSE_MEDIA_TYPE)


def _upstream_message(data: bytes) -> str:
    try:
        parsed = json.loads(data)
        return str(parsed["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return data[:200].decode("utf-8", "replace") or "(empty body)"


def _sse_error(data: bytes) -> dict | None:
    """The ``error`` object of the first SSE error event in ``data``, if any."""
    for line in data.splitlines():
        if not line.startswith(b"data: "):
            continue
        try:
            event = json.loads(line[len(b"data: "):])
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("error"), dict):
            return event["error"]
    return None


def served_by(**instances: Instance) -> dict[str, str]:
    """The response header naming the instances that served a request: ``prefill=HOST:PORT, decode=HOST:PORT``
    (or ``mixed=HOST:PORT``)."""
    return {SERVED_BY_HEADER: ", ".join(f"{role}={instance.key}" for role, instance in instances.items())}


def _too_large(instance: Instance, data: bytes, client_bytes: int) -> str:
    """An instance's 413 in the client's terms: the client's body size (the instance counted the router's
    rewrite, which carries `disaggregate_info`), and the instance's limit when its message names it."""
    limit = re.search(r"limit of (\d+) bytes", _upstream_message(data))
    bound = f"the limit of {limit.group(1)} bytes" if limit else "the limit"
    return (f"request body of {client_bytes} bytes exceeds {bound} of instance {instance.key} (its "
            "--max-body-bytes)")


def whole_events_end(buffer: bytes) -> int:
    """Length of the prefix of ``buffer`` made of complete SSE events (0 if none is complete yet)."""
    return max(buffer.rfind(b"\n\n") + 2 if b"\n\n" in buffer else 0,
               buffer.rfind(b"\r\n\r\n") + 4 if b"\r\n\r\n" in buffer else 0)


class Forwarder:
    """Sends requests to instances and turns their answers (or failures) into the client's response."""

    def __init__(self, registry: Registry, client: httpx.AsyncClient, metrics: RouterMetrics,
                 request_timeout_secs: float, health_interval_secs: float = 5.0):
        self._registry = registry
        self._health_interval = health_interval_secs
        self._client = client
        self._metrics = metrics
        self._timeout = request_timeout_secs
        self._tasks: set[asyncio.Task] = set()  # every upstream task, so shutdown can cancel them

    async def close(self) -> int:
        """Cancels every upstream request still in flight (router shutdown); returns how many there were."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(tasks)

    async def mixed(self, request: Request, path: str, raw_body: bytes, body: dict,
                    headers: dict[str, str]) -> Response:
        while True:   # each refusal takes one instance out of the healthy set, so this ends
            instance = self._registry.choose("mixed", body.get("model"))
            log.info("%s: mixed %s", path, instance.key)
            answer = await self._mixed_once(instance, request, path, raw_body, headers)
            if not isinstance(answer, Refused):
                return answer
            self._refused(instance, answer.error)

    async def _mixed_once(self, instance: Instance, request: Request, path: str, raw_body: bytes,
                          headers: dict[str, str]) -> Response | Refused:
        upstream = self._open(instance, path, raw_body, headers)
        watch = ClientWatch(request)
        relayed = False
        try:
            head = await self._until(upstream.head(), watch)
            if _streams(head):
                relayed = True
                return self._relay_response(instance, upstream, None, None, served_by(mixed=instance))
            return self._answer(instance, head, await self._until(upstream.read_all(), watch),
                                served_by(mixed=instance), len(raw_body))
        except UpstreamError as exc:
            failure = self._failure(instance, exc)
            return Refused(exc) if failure.refused else self._failure_response(failure)
        except ClientGone:
            return self._client_gone()
        finally:
            watch.stop()
            if not relayed:
                upstream.cancel()

    async def splitwise(self, request: Request, path: str, raw_body: bytes, body: dict,
                        headers: dict[str, str]) -> Response:
        while True:   # as in `mixed`: a refusing P or D is taken out of the healthy set and another pair chosen
            prefill_instance, decode_instance = self._registry.choose_pair(body.get("model"))
            answer = await self._splitwise_once(prefill_instance, decode_instance, request, path, raw_body,
                                                prompt_size(body), headers)
            if not isinstance(answer, Refused):
                return answer
            self._refused(prefill_instance if answer.prefill else decode_instance, answer.error)

    async def _splitwise_once(self, prefill_instance: Instance, decode_instance: Instance, request: Request,
                              path: str, raw_body: bytes, prefill_work: int,
                              headers: dict[str, str]) -> Response | Refused:
        info = {"request_id": request_id_for(path),
                "prefill_addr": prefill_instance.registration.connector_addr,
                "decode_addr": decode_instance.registration.connector_addr}
        payload = with_field(raw_body, "disaggregate_info", info)
        log.info("%s %s: prefill %s, decode %s", path, info["request_id"], prefill_instance.key, decode_instance.key)
        pair = served_by(prefill=prefill_instance, decode=decode_instance)
        decode = self._open(decode_instance, path, payload, headers)
        prefill_upstream = self._open(prefill_instance, path, payload, headers, prefill_work)
        prefill = self._track(asyncio.create_task(self._prefill_outcome(prefill_instance, prefill_upstream)))
        watch = ClientWatch(request)
        relayed = False
        leave_prefill = False  # True once D answered well: P's request then ends on its own
        try:
            head = await self._until(decode.head(), watch, prefill)
            if _streams(head):
                relayed = leave_prefill = True  # the relay now owns both requests
                return self._relay_response(decode_instance, decode, prefill, prefill_upstream, pair)
            data = await self._until(decode.read_all(), watch, prefill)
            # D refused (4xx/5xx): no reservation will come, so P's request is closed now rather than left
            # waiting for one until its deadline.
            leave_prefill = head.status_code < 300
            return self._answer(decode_instance, head, data, pair, len(raw_body))
        except PrefillFailed as exc:
            refused = exc.failure.refused
            return Refused(refused, prefill=True) if refused is not None else self._failure_response(exc.failure)
        except UpstreamError as exc:
            failure = self._failure(decode_instance, exc)
            return Refused(exc) if failure.refused else self._failure_response(failure)
        except ClientGone:
            return self._client_gone()
        finally:
            watch.stop()
            if not relayed:
                decode.cancel()
            if not leave_prefill:
                prefill_upstream.cancel()

    def _refused(self, instance: Instance, error: UpstreamError) -> None:
        """An instance that refuses connections is down (restarting, or gone before its heartbeat expired): it
        gets no request until its health checks pass again (docs/design.md "Router", Errors)."""
        self._registry.mark_unreachable(instance)
        log.warning("instance %s (%s) refused the connection; taken out until its health checks pass: %s",
                    instance.key, instance.role, error)

    def _open(self, instance: Instance, path: str, payload: bytes, headers: dict[str, str],
              prefill_work: int = 0) -> Upstream:
        """Sends the request; ``prefill_work`` (P only) counts against the instance until P has answered."""
        self._registry.acquire(instance, prefill_work)
        self._metrics.requests.labels(instance.key, instance.role).inc()
        deadline = asyncio.get_running_loop().time() + self._timeout
        upstream = Upstream(self._client, instance.key, instance.url + path, payload, headers, deadline)
        upstream.task.add_done_callback(lambda _: self._registry.release(instance, prefill_work))
        self._track(upstream.task)
        watchdog = asyncio.create_task(self._watch(instance, upstream))
        upstream.task.add_done_callback(lambda _: watchdog.cancel())
        return upstream

    async def _watch(self, instance: Instance, upstream: Upstream) -> None:
        """Ends `upstream` as lost (SERVICES §6, "Across hosts") once its instance has been out of service (the
        health checks found it unhealthy, or it stopped registering) for 3 health intervals in a row and its
        answer has been silent as long: an instance the router cannot reach would otherwise hold the request until
        the request deadline. An instance out of service yet still sending (overloaded, not gone) keeps its
        requests, and one back in service within 3 intervals (e.g. after a stall of the router's host) too."""
        patience_s = FAILURES_TO_UNHEALTHY * self._health_interval
        loop = asyncio.get_running_loop()
        out_since = None
        while True:
            await asyncio.sleep(self._health_interval)
            now = loop.time()
            if self._registry.is_serving(instance.key):
                out_since = None
                continue
            out_since = now if out_since is None else out_since
            silent_for = now - upstream.last_data_at
            if now - out_since >= patience_s and silent_for >= patience_s:
                upstream.lose(f"the {instance.role} instance stopped answering: out of service at the router for "
                              f"{now - out_since:.1f} s and its answer silent for {silent_for:.1f} s (partitioned "
                              f"from the router, or its host lost)")
                return

    def _track(self, task: asyncio.Task) -> asyncio.Task:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _until(self, awaitable, watch: ClientWatch | None, prefill: asyncio.Task | None = None):
        """Awaits ``awaitable``; raises ClientGone if the client leaves first, PrefillFailed if P fails first."""
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                if task.done():
                    return task.result()
                if watch is not None and watch.task.done():
                    raise ClientGone
                if prefill is not None and prefill.done() and prefill.result() is not None:
                    raise PrefillFailed(prefill.result())
                waiting = {t for t in (task, watch and watch.task, prefill) if t is not None and not t.done()}
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            task.cancel()

    def _relay_response(self, instance: Instance, upstream: Upstream, prefill: asyncio.Task | None,
                        partner: Upstream | None, headers: dict[str, str]) -> RelayResponse:
        state = RelayState()

        def on_close() -> None:
            upstream.cancel()
            if state.outcome != "done" and partner is not None:
                partner.cancel()  # D failed or the client left: P must not keep the request either
            if state.outcome is None:
                self._metrics.client_disconnects.inc()

        return RelayResponse(self._relay(instance, upstream, prefill, state), on_close, media_type=SSE_MEDIA_TYPE,
                             headers=headers)

    async def _relay(self, instance: Instance, upstream: Upstream, prefill: asyncio.Task | None,
                     state: RelayState):
        """SSE passthrough in whole events, so that an error event never lands inside a half-sent one."""
        buffer = b""
        while True:
            try:
                if prefill is None or (prefill.done() and prefill.result() is None):
                    chunk = await upstream.next_chunk()  # nothing to race: the cheap path for most chunks
                else:
                    chunk = await self._until(upstream.next_chunk(), None, prefill)
            except UpstreamError as exc:
                state.outcome = "failed"
                failure = self._failure(instance, exc)
                message = failure.body["error"]["message"]
                if exc.kind == "broken":   # the instance's end of the stream went away: it stopped (or died)
                    message = (f"the {instance.role} instance {instance.key} stopped mid-response (its connection "
                               f"closed before the stream's end: {exc.detail})")
                yield sse_error_event(failure.status, message)
                return
            except PrefillFailed as exc:
                state.outcome = "failed"
                yield sse_error_event(exc.failure.status, exc.failure.body["error"]["message"])
                return
            if chunk is None:
                state.outcome = "done"
                if buffer:
                    yield buffer
                return
            buffer += chunk
            if cut := whole_events_end(buffer):
                yield buffer[:cut]
                buffer = buffer[cut:]

    async def _prefill_outcome(self, instance: Instance, upstream: Upstream) -> Failure | None:
        """None once P has answered 2xx (handed off); otherwise the error for the client."""
        try:
            data = await upstream.read_all()
        except UpstreamError as exc:
            # Closed by the router itself (D failed, or the client left): not P's failure.
            return None if exc.kind == "cancelled" else self._failure(instance, exc, "prefill ")
        if upstream.response.status_code >= 300:
            return self._status_failure(instance, upstream.response.status_code, data, "prefill ")
        # A streamed answer is 200 from its first byte; a failure after that is an error event in the body.
        error = _sse_error(data) if _streams(upstream.response) else None
        if error is None:
            return None
        self._metrics.upstream_failures.labels(instance.key, instance.role, "status").inc()
        status = 503 if error.get("code") == 503 else 502
        return Failure(status, error_body(status, f"prefill instance {instance.key}: {error.get('message')}"))

    def _answer(self, instance: Instance, head: httpx.Response, data: bytes, headers: dict[str, str],
                client_bytes: int) -> Response:
        if head.status_code >= 500:
            return self._failure_response(self._status_failure(instance, head.status_code, data))
        if head.status_code == 413:   # the instance measured the body the router sent, not the client's
            return self._failure_response(Failure(413, error_body(413, _too_large(instance, data, client_bytes))))
        return Response(content=data, status_code=head.status_code, headers=headers,
                        media_type=head.headers.get("content-type", "application/json"))

    def _status_failure(self, instance: Instance, status: int, data: bytes, what: str = "") -> Failure:
        if status < 500:  # the instance's own 4xx: passed through (an OpenAI error object already)
            try:
                body = json.loads(data)
                if isinstance(body, dict) and isinstance(body.get("error"), dict):
                    return Failure(status, body)
            except ValueError:
                pass
            return Failure(status, error_body(status, _upstream_message(data)))
        self._metrics.upstream_failures.labels(instance.key, instance.role, "status").inc()
        mapped = 503 if status == 503 else 502
        return Failure(mapped, error_body(mapped, f"{what}instance {instance.key} answered {status}: "
                                                  f"{_upstream_message(data)}"))

    def _failure(self, instance: Instance, exc: UpstreamError, what: str = "") -> Failure:
        self._metrics.upstream_failures.labels(instance.key, instance.role, exc.kind).inc()
        status = _FAILURE_STATUS[exc.kind]
        return Failure(status, error_body(status, f"{what}{exc}"), exc if exc.kind == "connect" else None)

    @staticmethod
    def _failure_response(failure: Failure) -> Response:
        return Response(content=json.dumps(failure.body), status_code=failure.status,
                        media_type="application/json")

    def _client_gone(self) -> Response:
        self._metrics.client_disconnects.inc()
        return Response(status_code=_CLIENT_CLOSED)

