"""Runs one generation request against the engine core for the OpenAI endpoints: parse, check, submit, then
answer as one JSON body or as a Server-Sent-Events stream (SERVICES §3).

The endpoint modules (serving_completion, serving_chat) only say how the prompt is built and how a response or a
chunk looks (`ResponseFormat`); admission, errors, detokenisation, disconnect handling and metrics are here, once.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError

from fastdeploy.engine.core_client import EngineCoreClient, EngineDeadError
from fastdeploy.schema.core_protocol import AddRequest, RequestDelta
from fastdeploy.schema.request import FINISH_HANDED_OFF
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.entrypoints.openai.protocol import ErrorInfo, ErrorResponse, SamplingFields, SpecDecodeInfo, Usage
from fastdeploy.metrics.metrics import ServerMetrics
from fastdeploy.output.detokenizer import IncrementalDetokenizer

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "request_too_large", 429: "rate_limit_error", 500: "internal_error",
                503: "service_unavailable"}
_QUOTED_FIELD = re.compile(r"'(\w+)'")


class APIError(Exception):
    """Becomes an OpenAI error object with this HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        info = ErrorInfo(message=self.message, type=_ERROR_TYPES.get(self.status, "error"), param=self.param,
                         code=self.status)
        return ErrorResponse(error=info).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def validation_error(error: ValidationError, model: type[BaseModel]) -> APIError:
    """The first failure, named by its field path (list indices and union-member tags left out)."""
    first = error.errors()[0]
    names = _field_names(model)
    unknown = first["type"] == "extra_forbidden"   # the loc ends with the unknown field itself
    field = ".".join(str(p) for p in first["loc"] if p in names or (unknown and p == first["loc"][-1])) or None
    if unknown:
        return APIError(400, f"field '{field}' is not a known field of this endpoint", param=field)
    return APIError(400, f"field '{field}': {first['msg']}" if field else first["msg"], param=field)


class ResponseFormat(Protocol):
    """How one endpoint's bodies look; `text` pieces come detokenised and stop-stripped."""

    def response(self, request_id: str, text: str, finish_reason: str, usage: Usage,
                 spec: SpecDecodeInfo) -> BaseModel: ...

    def first_chunk(self, request_id: str) -> BaseModel | None: ...

    def chunk(self, request_id: str, text: str, finish_reason: str | None = None,
              spec: SpecDecodeInfo | None = None) -> BaseModel: ...

    def usage_chunk(self, request_id: str, usage: Usage) -> BaseModel: ...


class OpenAIServing:
    """The endpoints' shared state: the engine client, tokenizer, metrics and the admission limits."""

    def __init__(self, client: EngineCoreClient, tokenizer, model_name: str, metrics: ServerMetrics,
                 max_concurrency: int | None, max_body_bytes: int):
        self.client = client
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.metrics = metrics
        self.max_concurrency = max_concurrency
        self.max_body_bytes = max_body_bytes
        self.num_in_flight = 0

    async def parse(self, raw: Request, cls: type[SamplingFields]) -> SamplingFields:
        """Read the body (413 past the limit), decode JSON and validate it (400 naming the field)."""
        declared = raw.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise APIError(413, f"request body of {declared} bytes exceeds the limit of {self.max_body_bytes}")
        body = bytearray()
        async for part in raw.stream():
            body += part
            if len(body) > self.max_body_bytes:
                raise APIError(413, f"request body exceeds the limit of {self.max_body_bytes} bytes")
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise APIError(400, f"request body is not valid JSON: {error}") from None
        if not isinstance(data, dict):
            raise APIError(400, "request body must be a JSON object")
        try:
            request = cls.model_validate(data)
        except ValidationError as error:
            raise validation_error(error, cls) from None
        refused = request.refused_fields()
        if refused:
            raise APIError(400, f"field '{refused[0]}' is not supported with a non-default value", param=refused[0])
        if request.model != self.model_name:
            raise APIError(404, f"field 'model': model {request.model!r} does not exist (serving "
                                f"{self.model_name!r})", param="model")
        return request

    def sampling(self, request: SamplingFields, max_tokens: int | None) -> tuple[SamplingParams, list[list[int]]]:
        fields = dict(temperature=request.temperature, top_p=request.top_p, min_tokens=request.min_tokens,
                      stop=request.stop, seed=request.seed,
                      include_stop_str_in_output=request.include_stop_str_in_output)
        if max_tokens is not None:
            fields["max_tokens"] = max_tokens
        try:
            params = SamplingParams(**fields)
        except ValueError as error:
            raise _field_error(error) from None
        return params, [self.tokenizer.encode(s, add_bos=False) for s in params.stop]

    async def generate(self, raw: Request, request: SamplingFields, prompt_ids: list[int], prompt: str | None,
                       params: SamplingParams, stop_seqs: list[list[int]], id_prefix: str,
                       fmt: ResponseFormat):
        """Submit and answer; everything before the first byte of the answer can still be an HTTP error."""
        if not self.client.is_ready:
            raise APIError(503, f"the engine is not available ({self.client.dead_reason or self.client.state})")
        if self.max_concurrency is not None and self.num_in_flight >= self.max_concurrency:
            raise APIError(429, f"more than {self.max_concurrency} concurrent requests (--max-concurrency)")
        info = request.disaggregate_info
        request_id = str(info["request_id"]) if info and "request_id" in info else f"{id_prefix}-{uuid.uuid4().hex}"
        message = AddRequest(request_id=request_id, prompt_token_ids=prompt_ids, params=_params_dict(params),
                             stop_seqs=stop_seqs, prompt=prompt, disaggregate_info=info)
        run = _Run(self, request_id, message, params, request, fmt)
        self.num_in_flight += 1
        try:
            await run.open()
        except BaseException:
            await run.close()
            raise
        if request.stream:
            return StreamingResponse(run.stream(), media_type="text/event-stream")   # closes the run at its end
        try:
            return await _unless_disconnected(raw, run.collect())
        finally:
            await run.close()


class _Run:
    """One submitted request: its delta stream, detokeniser and metrics; `close` releases everything once."""

    def __init__(self, serving: OpenAIServing, request_id: str, message: AddRequest, params: SamplingParams,
                 request: SamplingFields, fmt: ResponseFormat):
        self.serving, self.request_id, self.message, self.request, self.fmt = serving, request_id, message, request, fmt
        self.detokenizer = IncrementalDetokenizer(serving.tokenizer, params.stop, params.include_stop_str_in_output)
        self.deltas: AsyncIterator[RequestDelta] = serving.client.generate(message)
        self.tracker = serving.metrics.track()
        self.first: RequestDelta | None = None
        self._closed = False

    async def open(self) -> None:
        """Wait for the engine's verdict on the request: the first delta (a refusal becomes a 400)."""
        try:
            self.first = await anext(self.deltas)
        except EngineDeadError as error:
            raise APIError(503, str(error)) from None
        if self.first.rejected:
            raise _field_error(ValueError(self.first.error))

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.serving.num_in_flight -= 1
            await self.deltas.aclose()   # aborts the request in the engine if it is still live

    async def _all(self) -> AsyncIterator[RequestDelta]:
        yield self.first
        async for delta in self.deltas:
            yield delta

    async def collect(self) -> JSONResponse:
        pieces = []
        try:
            async for delta in self._all():
                pieces.append(self._text(delta))
                if delta.finished:
                    return self._final_response(delta, "".join(pieces))
        except EngineDeadError as error:
            raise APIError(503, str(error)) from None
        raise APIError(503, "the engine ended the request without a result")

    def _final_response(self, delta: RequestDelta, text: str) -> JSONResponse:
        if delta.finish_reason == FINISH_HANDED_OFF:     # a prefill instance: D's response carries the output
            return JSONResponse(_handed_off(self.request_id))
        if delta.finish_reason not in ("stop", "length"):
            raise APIError(503, f"request aborted: {delta.error}")
        return JSONResponse(self.fmt.response(self.request_id, text, delta.finish_reason, _usage(delta),
                                              _spec(delta)).model_dump())

    def _text(self, delta: RequestDelta) -> str:
        self.tracker.on_tokens(len(delta.new_token_ids))
        text = self.detokenizer.push(delta.new_token_ids)
        if delta.finished:
            text += self.detokenizer.finish(delta.finish_reason)
            self.tracker.on_finished(delta)
        return text

    async def stream(self) -> AsyncIterator[str]:
        try:
            first = self.fmt.first_chunk(self.request_id)
            if first is not None:
                yield _sse(first)
            async for delta in self._all():
                text = self._text(delta)
                if delta.finished and delta.finish_reason == FINISH_HANDED_OFF:
                    yield _sse(_handed_off(self.request_id))
                    yield "data: [DONE]\n\n"
                    return
                if delta.finished and delta.finish_reason not in ("stop", "length"):
                    yield _sse(APIError(503, f"request aborted: {delta.error}").body())
                    return
                if delta.finished:
                    yield _sse(self.fmt.chunk(self.request_id, text, delta.finish_reason, _spec(delta)))
                    options = self.request.stream_options
                    if options is not None and options.include_usage:
                        yield _sse(self.fmt.usage_chunk(self.request_id, _usage(delta)))
                    yield "data: [DONE]\n\n"
                    return
                if text:
                    yield _sse(self.fmt.chunk(self.request_id, text))
        except EngineDeadError as error:
            yield _sse(APIError(503, str(error)).body())
        finally:
            await self.close()


def _handed_off(request_id: str) -> dict:
    """A prefill instance's answer once its hand-off to D is sent (SERVICES §6 step 4): a short status."""
    return {"id": request_id, "object": "pd.handoff", "status": FINISH_HANDED_OFF}


async def _unless_disconnected(raw: Request, work):
    """Run `work`; if the client disconnects first, cancel it (the caller's close then aborts the request)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(raw))
    try:
        done, _ = await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task in done:
        return task.result()
    raise APIError(499, "client disconnected")


async def _wait_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


def _field_names(model: type[BaseModel]) -> set[str]:
    names = set()
    for name, info in model.model_fields.items():
        names.add(name)
        for arg in (info.annotation, *getattr(info.annotation, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                names |= _field_names(arg)
    return names


def _field_error(error: ValueError) -> APIError:
    match = _QUOTED_FIELD.search(str(error))
    return APIError(400, str(error), param=match.group(1) if match else None)


def _params_dict(params: SamplingParams) -> dict:
    return {name: list(v) if isinstance(v := getattr(params, name), tuple) else v
            for name in SamplingParams.__dataclass_fields__}


def _usage(delta: RequestDelta) -> Usage:
    return Usage(prompt_tokens=delta.num_prompt_tokens, completion_tokens=delta.num_output_tokens,
                 total_tokens=delta.num_prompt_tokens + delta.num_output_tokens)


def _spec(delta: RequestDelta) -> SpecDecodeInfo:
    rounds = delta.num_decode_rounds
    return SpecDecodeInfo(num_decode_rounds=rounds, num_draft_tokens=delta.num_draft_tokens,
                          num_accepted_drafts=delta.num_accepted_drafts,
                          mean_accept_length=(delta.num_accepted_drafts + rounds) / rounds if rounds else 0.0)


def _sse(body: BaseModel | dict) -> str:
    data = body.model_dump_json() if isinstance(body, BaseModel) else json.dumps(body, separators=(",", ":"))
    return f"data: {data}\n\n"

