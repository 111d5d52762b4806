"""Serves `POST /v1/chat/completions` (SERVICES §3): messages rendered by the chat template, one choice."""
from __future__ import annotations

from fastapi import Request

from fastdeploy.entrypoints.chat_template import render_chat
from fastdeploy.entrypoints.openai.protocol import (ChatChoice, ChatCompletionChunk, ChatCompletionRequest,
                                                    ChatCompletionResponse, ChatDelta, ChatResponseMessage,
                                                    ChatStreamChoice, SpecDecodeInfo, Usage)
from fastdeploy.entrypoints.openai.serving_engine import APIError, OpenAIServing


class ChatFormat:
    def __init__(self, model: str):
        self.model = model

    def response(self, request_id: str, text: str, finish_reason: str, usage: Usage,
                 spec: SpecDecodeInfo) -> ChatCompletionResponse:
        choice = ChatChoice(message=ChatResponseMessage(content=text), finish_reason=finish_reason)
        return ChatCompletionResponse(id=request_id, model=self.model, choices=[choice], usage=usage,
                                      spec_decode=spec)

    def first_chunk(self, request_id: str) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=request_id, model=self.model,
                                   choices=[ChatStreamChoice(delta=ChatDelta(role="assistant", content=""))])

    def chunk(self, request_id: str, text: str, finish_reason: str | None = None,
              spec: SpecDecodeInfo | None = None) -> ChatCompletionChunk:
        choice = ChatStreamChoice(delta=ChatDelta(content=text), finish_reason=finish_reason)
        return ChatCompletionChunk(id=request_id, model=self.model, choices=[choice], spec_decode=spec)

    def usage_chunk(self, request_id: str, usage: Usage) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=request_id, model=self.model, choices=[], usage=usage)


async def create_chat_completion(serving: OpenAIServing, raw: Request):
    request = await serving.parse(raw, ChatCompletionRequest)
    if request.max_tokens is not None and request.max_completion_tokens is not None:
        raise APIError(400, "fields 'max_tokens' and 'max_completion_tokens' are exclusive", param="max_tokens")
    if not any(m.content.strip() for m in request.messages if m.role == "user"):
        raise APIError(400, "field 'messages' needs a user message with non-whitespace content", param="messages")
    prompt = render_chat([(m.role, m.content) for m in request.messages])
    params, stop_seqs = serving.sampling(request, request.max_tokens or request.max_completion_tokens)
    return await serving.generate(raw, request, serving.tokenizer.encode(prompt), prompt, params, stop_seqs,
                                  "chatcmpl", ChatFormat(serving.model_name))
