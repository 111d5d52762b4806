"""Defines the OpenAI-compatible request and response bodies (pydantic models) of the API server (SERVICES §3).

Requests are strict: unknown fields, wrong types and out-of-range values fail validation (the server answers 400
naming the field). Fields that OpenAI defines but that would change results here (`n` > 1, `logprobs`, `best_of`,
`echo`, penalties, `logit_bias`, `suffix`) are accepted only at their neutral value and otherwise refused by name
(`refused_fields`), never ignored.
"""
from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class SamplingFields(_Strict):
    """Fields shared by completions and chat completions. `temperature` defaults to 0 (greedy), the project's
    SamplingParams default (docs/serving.md)."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    min_tokens: int = Field(default=0, ge=0)                  # FastDeploy extension
    temperature: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    include_stop_str_in_output: bool = False                  # vLLM extension: keep the stop string in the text
    user: str | None = None
    disaggregate_info: dict | None = None                     # PD: set by the router, opaque to this server
    # Refused unless neutral (see refused_fields)
    n: int = 1
    logprobs: int | bool | None = None
    top_logprobs: int | None = None
    best_of: int | None = None
    echo: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    logit_bias: dict | None = None
    suffix: str | None = None

    def refused_fields(self) -> list[str]:
        """Fields set to a value this server cannot honour."""
        checks = {"n": self.n != 1, "logprobs": self.logprobs not in (None, False),
                  "top_logprobs": self.top_logprobs not in (None, 0), "best_of": self.best_of not in (None, 1),
                  "echo": self.echo, "presence_penalty": self.presence_penalty != 0,
                  "frequency_penalty": self.frequency_penalty != 0,
                  "repetition_penalty": self.repetition_penalty not in (None, 1.0),
                  "logit_bias": bool(self.logit_bias), "suffix": self.suffix is not None}
        return [name for name, refused in checks.items() if refused]


class CompletionRequest(SamplingFields):
    prompt: str | list[int]


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class SpecDecodeInfo(BaseModel):
    """The speculative-decoding figures of one request (docs/glossary.md): decode rounds, drafts verified,
    drafts accepted, and the mean accept length (tokens emitted per decode round)."""

    num_decode_rounds: int
    num_draft_tokens: int
    num_accepted_drafts: int
    mean_accept_length: float


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: None = None


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
    logprobs: None = None


class ChatStreamChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: None = None


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
