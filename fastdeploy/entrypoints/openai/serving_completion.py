"""Serves `POST /v1/completions` (SERVICES §3): the prompt is text or token ids; one choice."""
from __future__ import annotations

from fastapi import Request

from fastdeploy.entrypoints.openai.protocol import (CompletionChoice, CompletionRequest, CompletionResponse,
                                                    SpecDecodeInfo, Usage)
from fastdeploy.entrypoints.openai.serving_engine import APIError, OpenAIServing


class CompletionFormat:
    def __init__(self, model: str):
        self.model = model

    def response(self, request_id: str, text: str, finish_reason: str, usage: Usage,
                 spec: SpecDecodeInfo) -> CompletionResponse:
        return CompletionResponse(id=request_id, model=self.model, usage=usage, spec_decode=spec,
                                  choices=[CompletionChoice(text=text, finish_reason=finish_reason)])

    def first_chunk(self, request_id: str) -> None:
        return None

    def chunk(self, request_id: str, text: str, finish_reason: str | None = None,
              spec: SpecDecodeInfo | None = None) -> CompletionResponse:
        return CompletionResponse(id=request_id, model=self.model, spec_decode=spec,
                                  choices=[CompletionChoice(text=text, finish_reason=finish_reason)])

    def usage_chunk(self, request_id: str, usage: Usage) -> CompletionResponse:
        return CompletionResponse(id=request_id, model=self.model, choices=[], usage=usage)


async def create_completion(serving: OpenAIServing, raw: Request):
    request = await serving.parse(raw, CompletionRequest)
    if isinstance(request.prompt, str):
        if not request.prompt.strip():
            raise APIError(400, "field 'prompt' must not be empty or whitespace only", param="prompt")
        prompt, prompt_ids = request.prompt, serving.tokenizer.encode(request.prompt)
    else:
        if not request.prompt:
            raise APIError(400, "field 'prompt' must not be an empty list of token ids", param="prompt")
        prompt, prompt_ids = None, list(request.prompt)
    params, stop_seqs = serving.sampling(request, request.max_tokens)
    return await serving.generate(raw, request, prompt_ids, prompt, params, stop_seqs, "cmpl",
                                  CompletionFormat(serving.model_name))
