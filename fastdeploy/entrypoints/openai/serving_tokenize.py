"""Serves vLLM's `POST /tokenize` and `POST /detokenize` with vLLM's request and response shapes: the tokens the
served model would see for a prompt or a chat, and the text of a list of token ids."""
from __future__ import annotations

from fastapi import Request

from fastdeploy.entrypoints.openai.errors import APIError
from fastdeploy.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from fastdeploy.entrypoints.openai.serving_chat import render_prompt
from fastdeploy.entrypoints.openai.serving_engine import OpenAIServing


def token_str(tokenizer, token: int) -> str:
    """A printable name of one token: the character of a printable ASCII byte, `<0xNN>` for other bytes (the
    byte-fallback spelling), `<|bos|>` / `<|eos|>` / `<|pad|>` for the special ids."""
    specials = {tokenizer.bos_token_id: "<|bos|>", tokenizer.eos_token_id: "<|eos|>",
                tokenizer.pad_token_id: "<|pad|>"}
    if token in specials:
        return specials[token]
    return chr(token) if 0x20 <= token < 0x7f else f"<0x{token:02X}>"


async def tokenize(serving: OpenAIServing, raw: Request) -> dict:
    request: TokenizeRequest = await serving.read(raw, TokenizeRequest)
    if (request.prompt is None) == (request.messages is None):
        raise APIError(400, "exactly one of the fields 'prompt' and 'messages' is required", param="prompt")
    if request.prompt is not None:
        text = request.prompt
    else:
        if not request.messages:
            raise APIError(400, "field 'messages' must hold at least one message", param="messages")
        text = render_prompt(serving.chat_template, request.messages, request.add_generation_prompt,
                             request.continue_final_message)
    tokens = serving.tokenizer.encode(text, add_special_tokens=request.add_special_tokens is not False)
    strs = [token_str(serving.tokenizer, t) for t in tokens] if request.return_token_strs else None
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
