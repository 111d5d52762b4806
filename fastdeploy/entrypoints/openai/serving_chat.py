"""Serves `POST /v1/chat/completions` (SERVICES §3): messages rendered by the chat template into one prompt, one
choice per sample."""
from __future__ import annotations

from fastapi import Request

from fastdeploy.entrypoints.chat_template import ChatTemplate, ChatTemplateError, chat_prompt_ids
from fastdeploy.entrypoints.openai.errors import APIError
from fastdeploy.entrypoints.openai.generation import ChoiceResult
from fastdeploy.entrypoints.openai.logprobs import ChatLogprobsRenderer
from fastdeploy.entrypoints.openai.protocol import (ChatChoice, ChatCompletionChunk, ChatCompletionRequest,
                                                    ChatCompletionResponse, ChatDelta, ChatLogprobs, ChatMessage,
                                                    ChatResponseMessage, ChatStreamChoice, SpecDecodeInfo, Usage)
from fastdeploy.entrypoints.openai.serving_engine import OpenAIServing, PromptInput


class ChatFormat:
    def __init__(self, model: str):
        self.model = model

    def response(self, response_id: str, choices: list[ChoiceResult], usage: Usage,
                 spec: SpecDecodeInfo) -> ChatCompletionResponse:
        return ChatCompletionResponse(id=response_id, model=self.model, usage=usage, spec_decode=spec,
                                      choices=[ChatChoice(index=c.index, message=ChatResponseMessage(content=c.text),
                                                          finish_reason=c.finish_reason, logprobs=c.logprobs)
                                               for c in choices])

    def first_chunks(self, response_id: str, indices: list[int]) -> list[ChatCompletionChunk]:
        """One role chunk per choice before any text (as vLLM streams)."""
        return [ChatCompletionChunk(id=response_id, model=self.model,
                                    choices=[ChatStreamChoice(index=i, delta=ChatDelta(role="assistant", content=""))])
                for i in indices]

    def chunk(self, response_id: str, index: int, text: str, finish_reason: str | None = None,
              spec: SpecDecodeInfo | None = None, logprobs: ChatLogprobs | None = None) -> ChatCompletionChunk:
        choice = ChatStreamChoice(index=index, delta=ChatDelta(content=text), finish_reason=finish_reason,
                                  logprobs=logprobs)
        return ChatCompletionChunk(id=response_id, model=self.model, choices=[choice], spec_decode=spec)

    def usage_chunk(self, response_id: str, usage: Usage) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=response_id, model=self.model, choices=[], usage=usage)

    def logprobs_renderer(self, tokenizer) -> ChatLogprobsRenderer:
        return ChatLogprobsRenderer(tokenizer)


def template_messages(messages: list[ChatMessage]) -> list[dict]:
    """The messages as the template sees them: `developer` becomes `system`; content parts are joined with a
    newline (vLLM's rule for text parts); a missing content is allowed for an assistant message only."""
    rendered = []
    for i, message in enumerate(messages):
        content = message.content
        if content is None:
            if message.role != "assistant":
                raise APIError(400, f"field 'messages[{i}].content' is required for role {message.role!r}",
                               param=f"messages[{i}].content")
            content = ""
        elif isinstance(content, list):
            content = "\n".join(part.text for part in content)
        entry = {"role": "system" if message.role == "developer" else message.role, "content": content}
        if message.name is not None:
            entry["name"] = message.name
        rendered.append(entry)
    return rendered


def render_prompt(template: ChatTemplate | None, messages: list[ChatMessage], add_generation_prompt: bool | None,
                  continue_final_message: bool | None) -> str:
    """The prompt text of a chat request (400 naming the field when the combination cannot be rendered, or when
    the model has no chat template)."""
    if template is None:
        raise APIError(400, "field 'messages': this model ships no chat template (none in its "
                            "tokenizer_config.json); start the server with --chat-template FILE", param="messages")
    add, cont = add_generation_prompt is not False, bool(continue_final_message)
    if add and cont and add_generation_prompt is not None:
        raise APIError(400, "fields 'add_generation_prompt' and 'continue_final_message' cannot both be true",
                       param="continue_final_message")
    if cont and messages[-1].role != "assistant":
        raise APIError(400, "field 'continue_final_message' needs an assistant message last",
                       param="continue_final_message")
    try:
        return template.render(template_messages(messages), add_generation_prompt=add and not cont,
                               continue_final_message=cont)
    except ChatTemplateError as error:
        raise APIError(400, str(error), param="messages") from None


async def create_chat_completion(serving: OpenAIServing, raw: Request):
    request = await serving.parse(raw, ChatCompletionRequest)
    if request.max_tokens is not None and request.max_completion_tokens is not None:
        raise APIError(400, "fields 'max_tokens' and 'max_completion_tokens' are exclusive", param="max_tokens")
    user_texts = [m for m in template_messages(request.messages) if m["role"] == "user"]
    if not any(m["content"].strip() for m in user_texts):
        raise APIError(400, "field 'messages' needs a user message with non-whitespace content", param="messages")
    text = render_prompt(serving.chat_template, request.messages, request.add_generation_prompt,
                         request.continue_final_message)
    prompt = PromptInput(chat_prompt_ids(serving.tokenizer, text), text)
    params, stop_seqs = serving.sampling(request, request.max_tokens or request.max_completion_tokens
                                         or serving.rest_of_context([prompt]))
    serving.check_length(prompt, params, "messages")
    return await serving.generate(raw, request, [prompt], params, stop_seqs, "chatcmpl",
                                  ChatFormat(serving.model_name), "messages")
