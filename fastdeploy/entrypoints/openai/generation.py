"""Runs the engine requests of one HTTP request (one per prompt and sample) and answers them as one JSON body or
one Server-Sent-Events stream whose chunks carry each choice's `index` (docs/serving.md, "Several choices").

A choice is one engine request with its delta stream, detokeniser and metrics tracker. The choices of a request
run concurrently in the engine; their deltas are merged as they arrive. `close` aborts every unfinished choice
and releases the request's ids and admission slot, once.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import msgspec
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from fastdeploy.engine.core_client import EngineDeadError
from fastdeploy.schema.core_protocol import AddRequest, RequestDelta
from fastdeploy.schema.request import FINISH_HANDED_OFF
from fastdeploy.entrypoints.openai.errors import APIError, engine_refusal
from fastdeploy.entrypoints.openai.protocol import PromptTokensDetails, SpecDecodeInfo, Usage
from fastdeploy.output.detokenizer import IncrementalDetokenizer, ends_with_a_stop_seq

_DONE = "data: [DONE]\n\n"


@dataclass(slots=True)
class ChoiceResult:
    index: int
    text: str
    finish_reason: str
    logprobs: BaseModel | None = None   # the endpoint's logprobs object when the request asked


class ResponseFormat(Protocol):
    """How one endpoint's bodies look; texts come detokenised and stop-stripped."""

    def response(self, response_id: str, choices: list[ChoiceResult], usage: Usage,
                 spec: SpecDecodeInfo) -> BaseModel: ...

    def first_chunks(self, response_id: str, indices: list[int]) -> list[BaseModel]: ...

    def chunk(self, response_id: str, index: int, text: str, finish_reason: str | None = None,
              spec: SpecDecodeInfo | None = None, logprobs: BaseModel | None = None) -> BaseModel: ...

    def usage_chunk(self, response_id: str, usage: Usage) -> BaseModel: ...

    def logprobs_renderer(self, tokenizer) -> LogprobsRenderer:
        """A new per-choice renderer of this endpoint's logprobs objects (entrypoints/openai/logprobs.py)."""


class LogprobsRenderer(Protocol):
    def push(self, entries: list) -> BaseModel | None: ...

    def result(self) -> BaseModel: ...


class Choice:
    """One engine request of the response: choice `index`, its prompt counted once per prompt in the usage.
    When the detokenizer finds a stop string the engine will not stop at (its stop matches the stop strings' token
    ids, `message.stop_seqs`, which the output does not end with), `stop_engine` ends the engine request; its last
    delta then finishes the choice with "stop". Where the ids match, the engine ends it itself (with its EOS).
    Either way the choice emitted the tokens up to the one that completed the stop string: its usage and logprobs
    count those, as LLM.generate does."""

    def __init__(self, index: int, message: AddRequest, deltas: AsyncIterator[RequestDelta], tracker,
                 detokenizer: IncrementalDetokenizer, counts_prompt: bool,
                 logprobs: LogprobsRenderer | None = None, stop_engine=None):
        self.index, self.message, self.deltas, self.tracker = index, message, deltas, tracker
        self.detokenizer, self.counts_prompt, self.logprobs = detokenizer, counts_prompt, logprobs
        self.stop_engine = stop_engine
        self.first: RequestDelta | None = None
        self.last: RequestDelta | None = None
        self._stopping = False
        self._excess = 0               # tokens the engine sent after the stop string's last one
        self._tail: list[int] = []     # the last output tokens, as long as the longest stop sequence
        self._tail_len = max((len(seq) for seq in message.stop_seqs), default=0)

    async def open(self, through_receipt: bool = False) -> None:
        """Wait for the engine's verdict: the first delta. `through_receipt` (a decode instance's paired request):
        the verdict that counts is D's receipt of P's hand-off, so an empty acceptance is passed over (it carries
        nothing) until the first tokens or the end come: a hand-off refused as made for another request is then
        still an HTTP error (409), not an error event after a 200."""
        self.first = await anext(self.deltas)
        while through_receipt and not self.first.finished and not self.first.new_token_ids:
            self.first = await anext(self.deltas)

    def take(self, delta: RequestDelta) -> tuple[str, BaseModel | None]:
        """The text this delta releases (the rest of the text once it is the finished one), and the logprobs of
        its tokens when the request asked (every token's, held-back text or not: each is reported once, up to the
        delta that completed a stop string). A finished delta is `last` (with "stop" after a stop string)."""
        stopped_before = self.detokenizer.stopped
        text, taken = self.detokenizer.push_until_stop(delta.new_token_ids)
        # tokens past the one that completed a stop string (the engine's EOS after its own match, what it computed
        # before the abort landed, the rest of an MTP step) were not emitted: counted nowhere
        self._excess += len(delta.new_token_ids) - taken
        self.tracker.on_tokens(taken)
        if self._tail_len:
            self._tail = (self._tail + list(delta.new_token_ids[:taken]))[-self._tail_len:]
        if self.detokenizer.stopped and not delta.finished and not self._stopping and self.stop_engine is not None:
            self._stopping = True
            if not ends_with_a_stop_seq(self._tail, self.message.stop_seqs):
                self.stop_engine()
        if delta.finished:
            text += self.detokenizer.finish(delta.finish_reason)
            if self.detokenizer.stopped:
                delta = msgspec.structs.replace(delta, finish_reason="stop", error=None,
                                                num_output_tokens=delta.num_output_tokens - self._excess)
            self.last = delta
            self.tracker.on_finished(delta)
        logprobs = None if self.logprobs is None or stopped_before else \
            self.logprobs.push((delta.new_logprobs or [])[:taken])
        return text, logprobs


class Generation:
    """The choices of one HTTP request. `on_close` releases what the server reserved for it."""

    def __init__(self, response_id: str, choices: list[Choice], fmt: ResponseFormat, prompt_field: str,
                 include_usage: bool, on_close, pair_field: str | None = None):
        self.response_id, self.choices, self.fmt = response_id, choices, fmt
        self.prompt_field, self.include_usage, self._on_close = prompt_field, include_usage, on_close
        # The field that paired this request with its P on a decode instance (None elsewhere): opening waits for
        # D's receipt, and a hand-off made for another request is a 409 naming it.
        self.pair_field = pair_field
        self._pumps: list[asyncio.Task] = []
        self._closed = False

    async def open(self) -> None:
        """Every choice accepted by the engine (on a decode instance: past D's receipt of P's hand-off), or the
        first refusal as a 400 (503 if the engine is gone, 409 for a hand-off made for another request)."""
        through_receipt = self.pair_field is not None
        opening = [asyncio.ensure_future(choice.open(through_receipt)) for choice in self.choices]
        try:
            await asyncio.gather(*opening)
        except BaseException as error:
            for task in opening:   # no delta stream may still run when close() closes them
                task.cancel()
            await asyncio.gather(*opening, return_exceptions=True)
            if isinstance(error, EngineDeadError):
                raise APIError(503, str(error)) from None
            raise
        for choice in self.choices:
            if choice.first.rejected:
                raise engine_refusal(choice.first.error, self.prompt_field, choice.first.id_in_use)
            if choice.first.pair_mismatch:
                raise self._aborted(choice.first)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self._pumps:
            task.cancel()
        for task in self._pumps:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        try:
            for choice in self.choices:
                await choice.deltas.aclose()   # aborts the engine request if it is still live
        finally:
            self._on_close()

    async def deltas(self) -> AsyncIterator[tuple[Choice, RequestDelta]]:
        """Every choice's deltas up to its finished one, merged in arrival order (first deltas first)."""
        live = []
        for choice in self.choices:
            yield choice, choice.first
            if not choice.first.finished:
                live.append(choice)
        if len(live) == 1:
            async for delta in live[0].deltas:
                yield live[0], delta
            return
        queue: asyncio.Queue = asyncio.Queue()
        self._pumps = [asyncio.create_task(_pump(choice, queue)) for choice in live]
        remaining = len(live)
        while remaining:
            choice, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                remaining -= 1
                continue
            yield choice, item

    async def collect(self) -> JSONResponse:
        texts = {choice.index: [] for choice in self.choices}
        try:
            async for choice, delta in self.deltas():
                texts[choice.index].append(choice.take(delta)[0])
        except EngineDeadError as error:
            raise APIError(503, str(error)) from None
        failed = self._failure()
        if failed is not None:
            raise failed
        if all(c.last.finish_reason == FINISH_HANDED_OFF for c in self.choices):
            return JSONResponse(handed_off(self.response_id))
        results = [ChoiceResult(c.index, "".join(texts[c.index]), c.last.finish_reason,
                                None if c.logprobs is None else c.logprobs.result()) for c in self.choices]
        body = self.fmt.response(self.response_id, results, self._usage(), self._spec())
        return JSONResponse(body.model_dump())

    async def stream(self) -> AsyncIterator[str]:
        try:
            for chunk in self.fmt.first_chunks(self.response_id, [c.index for c in self.choices]):
                yield sse(chunk)
            async for choice, delta in self.deltas():
                text, logprobs = choice.take(delta)
                delta = choice.last if delta.finished else delta   # "stop" once a stop string ended it
                if delta.finished and delta.finish_reason == FINISH_HANDED_OFF:
                    continue
                if delta.finished and delta.finish_reason not in ("stop", "length"):
                    yield sse(self._aborted(delta).body())
                    return
                if delta.finished:
                    yield sse(self.fmt.chunk(self.response_id, choice.index, text, delta.finish_reason,
                                             _spec([delta]), logprobs))
                elif text or logprobs is not None:
                    yield sse(self.fmt.chunk(self.response_id, choice.index, text, logprobs=logprobs))
            if all(c.last.finish_reason == FINISH_HANDED_OFF for c in self.choices):
                yield sse(handed_off(self.response_id))
            elif self.include_usage:
                yield sse(self.fmt.usage_chunk(self.response_id, self._usage()))
            yield _DONE
        except EngineDeadError as error:
            yield sse(APIError(503, str(error)).body())
        finally:
            await self.close()

    def _failure(self) -> APIError | None:
        for choice in self.choices:
            if choice.last is None:
                return APIError(503, "the engine ended the request without a result")
            if choice.last.finish_reason not in ("stop", "length", FINISH_HANDED_OFF):
                return self._aborted(choice.last)
        return None

    def _aborted(self, delta: RequestDelta) -> APIError:
        """An engine request that ended without completing: the service's failure (503), except a pair whose P
        was given another request than D (the client's or its router's pairing error: 409, which must not be
        retried as it is)."""
        if delta.pair_mismatch:
            return APIError(409, f"request aborted: {delta.error}", param=self.pair_field)
        return APIError(503, f"request aborted: {delta.error}")

    def _usage(self) -> Usage:
        prompt = sum(c.last.num_prompt_tokens for c in self.choices if c.counts_prompt)
        completion = sum(c.last.num_output_tokens for c in self.choices)
        cached = sum(c.last.num_cached_tokens for c in self.choices if c.counts_prompt)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))

    def _spec(self) -> SpecDecodeInfo:
        return _spec([c.last for c in self.choices])


async def _pump(choice: Choice, queue: asyncio.Queue) -> None:
    """Forward one choice's deltas to the merged queue; None marks its end, an exception is forwarded."""
    try:
        async for delta in choice.deltas:
            queue.put_nowait((choice, delta))
        queue.put_nowait((choice, None))
    except asyncio.CancelledError:
        raise
    except Exception as error:   # EngineDeadError and the like end the whole response
        queue.put_nowait((choice, error))


def _spec(deltas: list[RequestDelta]) -> SpecDecodeInfo:
    rounds = sum(d.num_decode_rounds for d in deltas)
    accepted = sum(d.num_accepted_drafts for d in deltas)
    return SpecDecodeInfo(num_decode_rounds=rounds, num_draft_tokens=sum(d.num_draft_tokens for d in deltas),
                          num_accepted_drafts=accepted,
                          mean_accept_length=(accepted + rounds) / rounds if rounds else 0.0)


def handed_off(response_id: str) -> dict:
    """A prefill instance's answer once its hand-offs to D are sent (SERVICES §6 step 4): a short status."""
    return {"id": response_id, "object": "pd.handoff", "status": FINISH_HANDED_OFF}


def sse(body: BaseModel | dict) -> str:
    data = body.model_dump_json() if isinstance(body, BaseModel) else json.dumps(body, separators=(",", ":"))
    return f"data: {data}\n\n"
