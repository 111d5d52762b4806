"""Serves vLLM's `POST /tokenize` and `POST /detokenize` with vLLM's request and response shapes: the tokens the
served model would see for a prompt or a chat, and the text of a list of token ids."""
from __future__ import annotations

from fastapi import Request

from fastdeploy.entrypoints.chat_template import chat_prompt_ids
from fastdeploy.entrypoints.openai.errors import APIError
from fastdeploy.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from fastdeploy.entrypoints.openai.serving_chat import render_prompt
from fastdeploy.entrypoints.openai.serving_engine import OpenAIServing


async def tokenize(serving: OpenAIServing, raw: Request) -> dict:
    request: TokenizeRequest = await serving.read(raw, TokenizeRequest)
    if (request.prompt is None) == (request.messages is None):
        raise APIError(400, "exactly one of the fields 'prompt' and 'messages' is required", param="prompt")
    tokenizer = serving.tokenizer
    if request.prompt is not None:
        tokens = tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens is not False)
    else:
        if not request.messages:
            raise APIError(400, "field 'messages' must hold at least one message", param="messages")
        text = render_prompt(serving.chat_template, request.messages, request.add_generation_prompt,
                             request.continue_final_message)
        # the tokens a chat completion would send (BOS never doubled), unless add_special_tokens says otherwise
        tokens = chat_prompt_ids(tokenizer, text) if request.add_special_tokens is None else \
            tokenizer.encode(text, add_special_tokens=request.add_special_tokens)
    strs = [tokenizer.token_piece(t) for t in tokens] if request.return_token_strs else None
    return {"count": len(tokens), "max_model_len": serving.settings.max_model_len, "tokens": tokens,
            "token_strs": strs}


async def detokenize(serving: OpenAIServing, raw: Request) -> dict:
    request: DetokenizeRequest = await serving.read(raw, DetokenizeRequest)
    vocab = serving.tokenizer.vocab_size
    bad = next((i for i, t in enumerate(request.tokens) if t >= vocab), None)
    if bad is not None:
        raise APIError(400, f"field 'tokens[{bad}]' must be a token id in [0, {vocab}), got {request.tokens[bad]}",
                       param=f"tokens[{bad}]")
    return {"prompt": serving.tokenizer.decode(request.tokens)}
