"""Serves `POST /v1/completions` (SERVICES §3): the prompts as vLLM takes them (a string, a list of token ids, a
list of strings or a list of token-id lists), one choice per prompt and sample."""
from __future__ import annotations

from fastapi import Request

from fastdeploy.entrypoints.openai.errors import APIError
from fastdeploy.entrypoints.openai.generation import ChoiceResult
from fastdeploy.entrypoints.openai.logprobs import CompletionLogprobsRenderer
from fastdeploy.entrypoints.openai.protocol import (CompletionChoice, CompletionLogprobs, CompletionRequest,
                                                    CompletionResponse, SpecDecodeInfo, Usage)
from fastdeploy.entrypoints.openai.serving_engine import OpenAIServing, PromptInput

_SHAPES = "a string, a list of token ids, a list of strings or a list of token-id lists"


class CompletionFormat:
    def __init__(self, model: str):
        self.model = model

    def response(self, response_id: str, choices: list[ChoiceResult], usage: Usage,
                 spec: SpecDecodeInfo) -> CompletionResponse:
        return CompletionResponse(id=response_id, model=self.model, usage=usage, spec_decode=spec,
                                  choices=[CompletionChoice(index=c.index, text=c.text, finish_reason=c.finish_reason,
                                                            logprobs=c.logprobs) for c in choices])

    def first_chunks(self, response_id: str, indices: list[int]) -> list:
        return []

    def chunk(self, response_id: str, index: int, text: str, finish_reason: str | None = None,
              spec: SpecDecodeInfo | None = None, logprobs: CompletionLogprobs | None = None) -> CompletionResponse:
        return CompletionResponse(id=response_id, model=self.model, spec_decode=spec,
                                  choices=[CompletionChoice(index=index, text=text, finish_reason=finish_reason,
                                                            logprobs=logprobs)])

    def usage_chunk(self, response_id: str, usage: Usage) -> CompletionResponse:
        return CompletionResponse(id=response_id, model=self.model, choices=[], usage=usage)

    def logprobs_renderer(self, tokenizer) -> CompletionLogprobsRenderer:
        return CompletionLogprobsRenderer(tokenizer)


def completion_prompts(serving: OpenAIServing, prompt: object) -> tuple[list[PromptInput], list[str]]:
    """The prompts of `prompt` and the client's path of each (`prompt`, or `prompt[i]` for a list of them);
    APIError naming the element at fault."""
    if isinstance(prompt, str):
        return [_text_prompt(serving, prompt, "prompt")], ["prompt"]
    if not isinstance(prompt, list):
        raise APIError(400, f"field 'prompt' must be {_SHAPES}", param="prompt")
    if not prompt:
        raise APIError(400, "field 'prompt' must not be an empty list", param="prompt")
    if all(_is_token_id(t) for t in prompt):
        return [_id_prompt(serving, prompt, "prompt")], ["prompt"]
    paths = [f"prompt[{i}]" for i in range(len(prompt))]
    if all(isinstance(p, str) for p in prompt):
        return [_text_prompt(serving, p, path) for p, path in zip(prompt, paths)], paths
    if all(isinstance(p, list) for p in prompt):
        return [_id_prompt(serving, p, path) for p, path in zip(prompt, paths)], paths
    kinds = [_kind(p) for p in prompt]
    bad = next((i for i, kind in enumerate(kinds) if kind is None), None)
    if bad is None:
        bad = next(i for i, kind in enumerate(kinds) if kind != kinds[0])
    raise APIError(400, f"field 'prompt[{bad}]': prompt must be {_SHAPES}, not a mix of them or other values",
                   param=f"prompt[{bad}]")


def _kind(value: object) -> str | None:
    if _is_token_id(value):
        return "id"
    return "text" if isinstance(value, str) else ("ids" if isinstance(value, list) else None)


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text_prompt(serving: OpenAIServing, text: str, path: str) -> PromptInput:
    if not text.strip():
        raise APIError(400, f"field '{path}' must not be empty or whitespace only", param=path)
    return PromptInput(serving.tokenizer.encode(text), text)


def _id_prompt(serving: OpenAIServing, ids: list, path: str) -> PromptInput:
    if not ids:
        raise APIError(400, f"field '{path}' must not be an empty list of token ids", param=path)
    vocab = serving.tokenizer.vocab_size
    for i, token in enumerate(ids):
        if not _is_token_id(token) or not 0 <= token < vocab:
            raise APIError(400, f"field '{path}[{i}]' must be a token id in [0, {vocab})",
                           param=f"{path}[{i}]")
    return PromptInput(list(ids))


async def create_completion(serving: OpenAIServing, raw: Request):
    request = await serving.parse(raw, CompletionRequest)
    prompts, paths = completion_prompts(serving, request.prompt)
    params, stop_seqs = serving.sampling(request, request.max_tokens or serving.rest_of_context(prompts))
    for prompt, path in zip(prompts, paths):
        serving.check_length(prompt, params, path)
    return await serving.generate(raw, request, prompts, params, stop_seqs, "cmpl",
                                  CompletionFormat(serving.model_name), "prompt")
