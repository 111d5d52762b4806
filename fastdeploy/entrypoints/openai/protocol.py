"""Defines the OpenAI-compatible request and response bodies (pydantic models) of the API server (SERVICES §3).

Requests are strict: unknown fields, wrong types and out-of-range values fail validation (the server answers 400
naming the field). Every optional field also accepts `null`, meaning its default (as vLLM does). Fields that
OpenAI defines but that this server cannot honour are accepted only at their neutral value and otherwise refused
by name with the reason (`refused_fields`), never ignored. docs/serving.md lists every field with its status.
"""
from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fastdeploy.http.json_body import INT64_MAX
from fastdeploy.schema.pairing import address_error, peer_address_error, request_id_error

MAX_CHOICES = 128          # prompts x n of one request (OpenAI's own bound on n)
MAX_COMPLETION_LOGPROBS = 5   # OpenAI's bound on completions `logprobs`
MAX_TOP_LOGPROBS = 20         # OpenAI's bound on chat `top_logprobs` (SamplingParams.MAX_LOGPROBS)

Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
Positive = Annotated[int, Field(ge=1, le=INT64_MAX)]
Number = Annotated[float, Field(allow_inf_nan=False)]
BootstrapHost = Annotated[str, Field(min_length=1, max_length=253)]
BootstrapPort = Annotated[int, Field(ge=1, le=65535)]
BootstrapRoom = Annotated[int, Field(ge=0, le=(1 << 64) - 1)]
_BOOTSTRAP_LIST = Field(min_length=1, max_length=MAX_CHOICES)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool | None = None


class DisaggregateInfo(_Strict):
    """Set by the PD router (SERVICES §6): the request's id and the two connectors' addresses."""

    request_id: str
    prefill_addr: str | None = None
    decode_addr: str | None = None

    @field_validator("request_id")
    @classmethod
    def _request_id(cls, value: str) -> str:
        return _checked(request_id_error(value), value)

    @field_validator("prefill_addr")
    @classmethod
    def _prefill_address(cls, value: str | None) -> str | None:
        return value if value is None else _checked(peer_address_error(value), value)

    @field_validator("decode_addr")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return value if value is None else _checked(address_error(value), value)


def _checked(why: str | None, value):
    """A pairing field's value, or the schema/pairing.py rule it breaks (pydantic names the field)."""
    if why is not None:
        raise ValueError(why)
    return value


class SamplingFields(_Strict):
    """Fields shared by completions and chat completions. `temperature` defaults to 0 (greedy), the project's
    SamplingParams default (docs/serving.md)."""

    model: str | None = None                                  # null or absent: the first served name
    max_tokens: Positive | None = None
    min_tokens: Count | None = None                           # FastDeploy extension
    temperature: Number | None = Field(default=None, ge=0.0)
    top_p: Number | None = Field(default=None, gt=0.0, le=1.0)
    # The sampling controls of docs/serving.md; their ranges are SamplingParams' (a 400 naming the field)
    top_k: int | None = None
    min_p: Number | None = None
    repetition_penalty: Number | None = None
    frequency_penalty: Number | None = None
    presence_penalty: Number | None = None
    seed: Count | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Count] | None = None                 # vLLM extension
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    include_stop_str_in_output: bool | None = None            # vLLM extension: keep the stop string in the text
    user: str | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    disaggregate_info: DisaggregateInfo | None = None         # PD: set by the router
    cache_salt: str | None = None                             # vLLM extension: a per-request prefix-cache salt
    # SGLang's PD pairing (sglang-router sets them; a list per prompt or sample): entrypoints/openai/sglang_compat.py
    bootstrap_host: BootstrapHost | Annotated[list[BootstrapHost], _BOOTSTRAP_LIST] | None = None
    bootstrap_port: BootstrapPort | Annotated[list[BootstrapPort], _BOOTSTRAP_LIST] | None = None
    bootstrap_room: BootstrapRoom | Annotated[list[BootstrapRoom], _BOOTSTRAP_LIST] | None = None
    # SGLang's sampling fields (docs/serving.md)
    ignore_eos: bool | None = None                            # the model's EOS ids do not end the request
    no_stop_trim: bool | None = None                          # true: as include_stop_str_in_output
    skip_special_tokens: bool | None = None                   # either way: special ids have no text here
    return_hidden_states: bool | None = None                  # refused unless false
    # Refused unless neutral (see refused_fields)
    best_of: Positive | None = None
    echo: bool | None = None
    logit_bias: dict | None = None
    top_logprobs: Count | None = None

    def refused_fields(self) -> list[tuple[str, str]]:
        """(field, why) for each field set to a value this server cannot honour."""
        checks = [("best_of", self.best_of not in (None, 1), "is not supported: use n for several samples"),
                  ("echo", bool(self.echo), "is not supported"),
                  ("logit_bias", bool(self.logit_bias), "is not supported"),
                  ("return_hidden_states", bool(self.return_hidden_states), "is not supported: hidden states "
                                                                            "are not returned")]
        checks += self._refused_extra()
        return [(name, why) for name, refused, why in checks if refused]

    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: the alternatives asked per token, None when no logprobs are asked."""
        return None

    def _refused_extra(self) -> list[tuple[str, bool, str]]:
        return []


class CompletionRequest(SamplingFields):
    # a string, a list of token ids, a list of strings or a list of token-id lists (checked in
    # serving_completion, which names the element at fault)
    prompt: object = Field(default=...)
    logprobs: Annotated[int, Field(ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    suffix: str | None = None

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def _refused_extra(self) -> list[tuple[str, bool, str]]:
        return [("suffix", self.suffix is not None, "is not supported (no fill-in-the-middle)"),
                ("top_logprobs", self.top_logprobs not in (None, 0), "is a chat completions field: completions "
                 f"take 'logprobs' (the number of alternatives, 0..{MAX_COMPLETION_LOGPROBS})")]


class TextPart(_Strict):
    """One part of a message's content; only text parts exist for these text-only models."""

    type: str
    text: str

    @field_validator("type")
    @classmethod
    def _text_only(cls, value: str) -> str:
        if value != "text":
            raise ValueError(f"content parts of type {value!r} are not supported: the served model reads text "
                             "only (use type 'text')")
        return value


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Positive | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    add_generation_prompt: bool | None = None                 # vLLM extension (default true)
    continue_final_message: bool | None = None                # vLLM extension (default false)
    separate_reasoning: bool | None = None                    # SGLang: ignored (no reasoning parser)
    stream_reasoning: bool | None = None                      # SGLang: ignored (no reasoning parser)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict | None = None

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def _refused_extra(self) -> list[tuple[str, bool, str]]:
        no_tools = "is not supported: the served model has no tool calling (no tool parser or tool template)"
        return [("top_logprobs", bool(self.top_logprobs) and not self.logprobs, "needs 'logprobs': true"),
                ("tools", bool(self.tools), no_tools),
                ("tool_choice", self.tool_choice not in (None, "none", "auto"), no_tools),
                ("response_format", self.response_format not in (None, {"type": "text"}),
                 "is not supported: structured output (JSON mode, JSON schema) is not implemented; only "
                 "{\"type\": \"text\"}")]


class TokenizeRequest(_Strict):
    """vLLM's /tokenize: a `prompt`, or chat `messages` rendered by the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    return_token_strs: bool | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[Count]


class PromptTokensDetails(BaseModel):
    cached_tokens: int      # prompt tokens whose KV came from the instance's prefix cache (PD_MTP_FLOW §13)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class SpecDecodeInfo(BaseModel):
    """The speculative-decoding figures of one request (docs/glossary.md): decode rounds, drafts verified,
    drafts accepted, and the mean accept length (tokens emitted per decode round)."""

    num_decode_rounds: int
    num_draft_tokens: int
    num_accepted_drafts: int
    mean_accept_length: float


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions format, one entry per token: its text, its logprob, {text: logprob} of the
    token and the top N alternatives, and the character offset in the choice's text where the token starts."""

    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    spec_decode: SpecDecodeInfo | None = None


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str


class ChatDelta(BaseModel):
    role: str | None = None
    content: str | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatResponseMessage
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatStreamChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    spec_decode: SpecDecodeInfo | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: Usage | None = None
    spec_decode: SpecDecodeInfo | None = None


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
