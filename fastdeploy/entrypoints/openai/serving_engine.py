"""Admits one OpenAI request and submits it to the engine core: parse, check, build one engine request per prompt
and sample, then answer through `generation.Generation` (SERVICES §3).

The endpoint modules (serving_completion, serving_chat) only say how the prompts are built and how a response or a
chunk looks; body limits, validation, the role rules of a PD instance, request ids, seeds, admission and client
disconnects are here, once.
"""
from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError

from fastdeploy.engine.core_client import EngineCoreClient
from fastdeploy.schema.core_protocol import AddRequest
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.entrypoints.chat_template import ChatTemplate
from fastdeploy.entrypoints.openai.errors import APIError, field_error, validation_error
from fastdeploy.entrypoints.openai.generation import Choice, Generation, ResponseFormat
from fastdeploy.http.json_body import BodyError, parse_object, read_body
from fastdeploy.entrypoints.openai.protocol import MAX_CHOICES, SamplingFields
from fastdeploy.entrypoints.openai.sglang_compat import bootstrap_given, bootstrap_pairing, connector_port
from fastdeploy.metrics.metrics import ServerMetrics
from fastdeploy.output.detokenizer import IncrementalDetokenizer
from fastdeploy.tokenizer import Tokenizer

ROUTER_ONLY = "send requests to the router"


@dataclass(slots=True)
class ServingSettings:
    """What the request checks need to know of the instance (from its flags)."""

    model_names: tuple[str, ...]           # the first is the reported name; any is accepted in `model`
    role: str                              # mixed, prefill or decode
    max_model_len: int
    max_concurrency: int | None
    max_body_bytes: int
    model_aliases: tuple[str, ...] = ()    # also accepted in `model`, not listed: the --model string as given
    sampling_defaults: dict = field(default_factory=dict)   # generation_defaults.py: for fields a request leaves unset


@dataclass(slots=True)
class PromptInput:
    """One prompt of a request: its token ids (BOS included) and its text when the client sent text."""

    token_ids: list[int]
    text: str | None = None


class OpenAIServing:
    """The endpoints' shared state: the engine client, tokenizer, chat template, metrics, settings and the ids in
    flight."""

    def __init__(self, client: EngineCoreClient, tokenizer: Tokenizer, chat_template: ChatTemplate | None,
                 metrics: ServerMetrics, settings: ServingSettings):
        self.client, self.tokenizer, self.chat_template = client, tokenizer, chat_template
        self.metrics, self.settings = metrics, settings
        self.num_in_flight = 0
        self._ids_in_flight: set[str] = set()
        self._stop_tasks: set[asyncio.Task] = set()   # aborts sent for stop strings (held until they are sent)

    @property
    def model_name(self) -> str:
        return self.settings.model_names[0]

    async def read(self, raw: Request, cls: type[BaseModel]) -> BaseModel:
        """Read the body (413 past the limit), decode it and validate it (400 naming the field), check `model`."""
        try:
            data = parse_object(await read_body(raw, self.settings.max_body_bytes, "--max-body-bytes"))
        except BodyError as error:
            raise APIError(error.status, error.message, error.param) from None
        try:
            request = cls.model_validate(data)
        except ValidationError as error:
            raise validation_error(error, cls) from None
        if request.model is not None and request.model not in self.settings.model_names + \
                self.settings.model_aliases:
            raise APIError(404, f"field 'model': model {request.model!r} does not exist (serving "
                                f"{', '.join(map(repr, self.settings.model_names))})", param="model")
        return request

    async def parse(self, raw: Request, cls: type[SamplingFields]) -> SamplingFields:
        """`read`, then the fields this server refuses and the rules of this instance's role."""
        request = await self.read(raw, cls)
        refused = request.refused_fields()
        if refused:
            name, why = refused[0]
            raise APIError(400, f"field '{name}' {why}", param=name)
        if request.stream_options is not None and not request.stream:
            raise APIError(400, "field 'stream_options' is only allowed with 'stream': true",
                           param="stream_options")
        self.pairing(request)      # the role's rules, before any prompt is tokenised
        return request

    def pairing(self, request: SamplingFields) -> dict | None:
        """The engine's `disaggregate_info` of this request; 400 naming the field. A mixed instance takes no
        `disaggregate_info` and ignores SGLang's bootstrap fields (as an SGLang server without disaggregation does);
        a P or D instance takes only requests a router paired: the built-in router's `disaggregate_info`, or the
        one SGLang's bootstrap fields give (sglang_compat)."""
        role, info, bootstrap = self.settings.role, request.disaggregate_info, bootstrap_given(request)
        if role == "mixed":
            if info is not None:
                raise APIError(400, "field 'disaggregate_info' is for prefill and decode instances (the PD router "
                                    "sets it); this instance is mixed", param="disaggregate_info")
            return None
        if info is not None and bootstrap:
            raise APIError(400, f"fields 'disaggregate_info' and '{bootstrap[0]}' are two ways of pairing P and D "
                                "(the built-in router's and sglang-router's); a request carries one",
                           param=bootstrap[0])
        if bootstrap:
            own_port = connector_port(self.client.ready_info) if role == "prefill" else None
            return bootstrap_pairing(request, own_port)
        half = "prefill (P)" if role == "prefill" else "decode (D)"
        if info is None:
            raise APIError(400, f"this instance is the {half} half of a PD deployment and serves only requests "
                                f"paired by a router: {ROUTER_ONLY} (fastdeploy.router.launch, or sglang-router "
                                "--pd-disaggregation)")
        if role == "decode" and info.prefill_addr is None:
            raise APIError(400, "field 'disaggregate_info.prefill_addr' is required on a decode instance (the PD "
                                f"router sets it): {ROUTER_ONLY}", param="disaggregate_info.prefill_addr")
        return info.model_dump(exclude_none=True)

    def sampling(self, request: SamplingFields, max_tokens: int | None) -> tuple[SamplingParams, list[list[int]]]:
        """The request's SamplingParams (null fields take their defaults) and its stop strings as token ids."""
        keep_stop = request.include_stop_str_in_output
        if request.no_stop_trim:      # SGLang's spelling of the same
            keep_stop = True
        given = dict(temperature=request.temperature, top_p=request.top_p, min_tokens=request.min_tokens,
                     stop=request.stop, seed=request.seed, stop_token_ids=request.stop_token_ids,
                     include_stop_str_in_output=keep_stop, max_tokens=max_tokens, ignore_eos=request.ignore_eos,
                     logprobs=request.num_logprobs(), cache_salt=request.cache_salt, top_k=request.top_k,
                     min_p=request.min_p, repetition_penalty=request.repetition_penalty,
                     frequency_penalty=request.frequency_penalty, presence_penalty=request.presence_penalty)
        given = {**self.settings.sampling_defaults, **{name: v for name, v in given.items() if v is not None}}
        try:
            params = SamplingParams(**given)
        except ValueError as error:
            raise field_error(error) from None
        # The engine stops at these token ids (FastDeploy's way); the detokenizer finds the strings whatever the tokens.
        return params, [self.tokenizer.encode(s, add_special_tokens=False) for s in params.stop]

    def rest_of_context(self, prompts: list[PromptInput]) -> int:
        """max_tokens when a request gives none (vLLM's default): what max_model_len leaves after the longest
        prompt; at least 1, so that a prompt filling the context is refused by check_length naming the prompt."""
        return max(self.settings.max_model_len - max(len(p.token_ids) for p in prompts), 1)

    def check_length(self, prompt: PromptInput, params: SamplingParams, field: str) -> None:
        """prompt + max_tokens must fit max_model_len (exactly equal fits)."""
        limit, size = self.settings.max_model_len, len(prompt.token_ids)
        if size + params.max_tokens <= limit:
            return
        if size >= limit:
            raise APIError(400, f"field '{field}': the prompt has {size} tokens, max_model_len is {limit} "
                                f"(prompt + max_tokens must be <= max_model_len)", param=field)
        raise APIError(400, f"field 'max_tokens': prompt ({size} tokens) + max_tokens ({params.max_tokens}) "
                            f"exceeds max_model_len ({limit}); at most {limit - size} tokens can be generated",
                       param="max_tokens")

    async def generate(self, raw: Request, request: SamplingFields, prompts: list[PromptInput],
                       params: SamplingParams, stop_seqs: list[list[int]], id_prefix: str, fmt: ResponseFormat,
                       prompt_field: str):
        """Submit one engine request per (prompt, sample) and answer; everything before the first byte of the
        answer can still be an HTTP error."""
        if not self.client.is_ready:
            raise APIError(503, f"the engine is not available ({self.client.dead_reason or self.client.state})")
        if self.settings.max_concurrency is not None and self.num_in_flight >= self.settings.max_concurrency:
            raise APIError(429, f"more than {self.settings.max_concurrency} concurrent requests (--max-concurrency)")
        pd, id_field = self.pairing(request), "disaggregate_info.request_id"
        if request.disaggregate_info is not None:
            response_id = base_id = pd["request_id"]       # the built-in router's id, as the client sees it
        else:
            response_id = base_id = f"{id_prefix}-{uuid.uuid4().hex}"
            if pd is not None:                              # paired by SGLang's room: the engine ids come from it
                base_id, id_field = pd["request_id"], "bootstrap_room"
        messages = self._messages(request, base_id, prompts, params, stop_seqs, pd)
        self._reserve([m.request_id for _, m in messages], id_field)
        options = request.stream_options
        paired_on_d = pd is not None and self.settings.role == "decode"
        generation = Generation(response_id, [], fmt, prompt_field,
                                bool(options is not None and options.include_usage),
                                lambda: self._release([m.request_id for _, m in messages]),
                                pair_field=id_field if paired_on_d else None)
        for index, (counts_prompt, message) in enumerate(messages):
            generation.choices.append(self._choice(index, message, counts_prompt, fmt))
        try:
            if paired_on_d:   # opening waits for P's hand-off: a client that leaves meanwhile aborts it
                await _unless_disconnected(raw, generation.open())
            else:
                await generation.open()
        except BaseException:
            await generation.close()
            raise
        if request.stream:
            return StreamingResponse(generation.stream(), media_type="text/event-stream")   # closes it at its end
        try:
            return await _unless_disconnected(raw, generation.collect())
        finally:
            await generation.close()

    def _messages(self, request: SamplingFields, base_id: str, prompts: list[PromptInput],
                  params: SamplingParams, stop_seqs: list[list[int]],
                  pd: dict | None) -> list[tuple[bool, AddRequest]]:
        """One AddRequest per choice, prompt-major (choice index = prompt index * n + sample index, as vLLM
        numbers them). A lone choice keeps `base_id` as its engine id (a PD pair then shares the router's id, or
        the one derived from SGLang's room); several get `<id>-<index>`, the same on P and D. Sample j is seeded
        with seed + j (vLLM's rule)."""
        n = request.n or 1
        if len(prompts) * n > MAX_CHOICES:
            raise APIError(400, f"prompts x n is {len(prompts) * n}; at most {MAX_CHOICES} choices per request",
                           param="n")
        messages = []
        for p, prompt in enumerate(prompts):
            for j in range(n):
                index = p * n + j
                engine_id = base_id if len(prompts) * n == 1 else f"{base_id}-{index}"
                fields = _params_dict(params)
                if params.seed is not None:
                    fields["seed"] = params.seed + j
                info = None if pd is None else {**pd, "request_id": engine_id}
                messages.append((j == 0, AddRequest(request_id=engine_id, prompt_token_ids=prompt.token_ids,
                                                    params=fields, stop_seqs=stop_seqs, prompt=prompt.text,
                                                    disaggregate_info=info)))
        return messages

    def _choice(self, index: int, message: AddRequest, counts_prompt: bool, fmt: ResponseFormat) -> Choice:
        params = message.params
        detokenizer = IncrementalDetokenizer(self.tokenizer, tuple(params["stop"]),
                                             params["include_stop_str_in_output"], message.prompt_token_ids,
                                             params["min_tokens"])
        logprobs = None if params["logprobs"] is None else fmt.logprobs_renderer(self.tokenizer)

        def stop_engine() -> None:   # a stop string the engine's token-id match missed: end the request there
            task = asyncio.ensure_future(self.client.abort(message.request_id, "stop string reached"))
            self._stop_tasks.add(task)
            task.add_done_callback(self._stop_tasks.discard)

        return Choice(index, message, self.client.generate(message), self.metrics.track(), detokenizer,
                      counts_prompt, logprobs, stop_engine)

    def _reserve(self, ids: list[str], field: str) -> None:
        """Claim the engine ids (409 naming `field` if one is in flight already: a PD id or room used twice)."""
        taken = [i for i in ids if i in self._ids_in_flight]
        if taken:
            raise APIError(409, f"field '{field}': request id {taken[0]!r} is already in use by a request in "
                                "flight", param=field)
        self._ids_in_flight.update(ids)
        self.num_in_flight += 1

    def _release(self, ids: list[str]) -> None:
        self._ids_in_flight.difference_update(ids)
        self.num_in_flight -= 1


async def _unless_disconnected(raw: Request, work):
    """Run `work`; if the client disconnects first, cancel it (the caller's close then aborts the request)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(raw))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (watcher, task):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
    if task in done:
        return task.result()
    raise APIError(499, "client disconnected")


async def _wait_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


def _params_dict(params: SamplingParams) -> dict:
    return {name: list(v) if isinstance(v := getattr(params, name), tuple) else v
            for name in SamplingParams.__dataclass_fields__}
