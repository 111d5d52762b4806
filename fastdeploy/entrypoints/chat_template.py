"""Renders chat messages into prompt text with a Jinja chat template (docs/serving.md, "Chat template").

Templates are rendered as Hugging Face's `apply_chat_template` and vLLM render them: a sandboxed Jinja environment
with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, `raise_exception` and `strftime_now` as
globals, a `tojson` filter, and the variables `messages` (dicts with `role`, `content` and `name` when given),
`add_generation_prompt`, `tools` (always none here) and the tokenizer's special tokens as its config spells them
(`bos_token`, `eos_token`, `pad_token`, `unk_token`, `cls_token`, `sep_token`, ...: `Tokenizer.special_tokens`).

Which template: `--chat-template FILE`, else the checkpoint's own (`tokenizer_config.json`'s `chat_template`, or
`chat_template.jinja`), else, for the embedded models, the built-in one. A checkpoint that ships none has no chat
template: chat requests are refused (400) until one is given with --chat-template.

The embedded models were trained on plain text, so the built-in template is deliberately small: each message
becomes `<|role|>\n{content}\n`, and with `add_generation_prompt` the prompt ends with `<|assistant|>\n`. Their
byte-level tokenizer has no text form of its special tokens, so `bos_token` and the others are empty strings.

BOS is the template's (`chat_prompt_ids`): the rendered prompt is tokenised without added special tokens, as Hugging
Face's `apply_chat_template(tokenize=True)` and vLLM do, so BOS stands where the template writes `{{ bos_token }}`
and nowhere else. The byte tokenizer's BOS has no text form a template could write: it is added as for plain text.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

BUILTIN_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template could not render these messages (its own `raise_exception`, or a runtime error)."""


def _raise_exception(message: str):
    raise ChatTemplateError(message)


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class ChatTemplate:
    """One compiled chat template; `render` turns messages into the prompt text."""

    def __init__(self, source: str = BUILTIN_TEMPLATE, special_tokens: dict[str, str] | None = None):
        self.source = source
        self.special_tokens = {"bos_token": "", "eos_token": "", "pad_token": "", **(special_tokens or {})}
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(f"not a valid Jinja template: line {error.lineno}: {error.message}") from None

    @classmethod
    def from_file(cls, path: str, special_tokens: dict[str, str] | None = None) -> ChatTemplate:
        """ValueError naming the file when it cannot be read or is not a valid Jinja template."""
        try:
            return cls(Path(path).read_text(encoding="utf-8"), special_tokens)
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"--chat-template {path}: cannot read the file ({error})") from None
        except ValueError as error:
            raise ValueError(f"--chat-template {path}: {error}") from None

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               continue_final_message: bool = False) -> str:
        """The prompt text of `messages` (each a dict with `role`, `content` and optionally `name`). With
        `continue_final_message` the text ends right after the final message's content, so the model continues
        that message (vLLM's meaning). Raises ChatTemplateError."""
        if not messages:
            raise ChatTemplateError("argument 'messages' must hold at least one message")
        try:
            text = self._template.render(**self.special_tokens, messages=messages,
                                         add_generation_prompt=add_generation_prompt, tools=None)
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError) as error:
            raise ChatTemplateError(f"the chat template failed on these messages: {type(error).__name__}: "
                                    f"{error}") from None
        if continue_final_message:
            final = messages[-1]["content"]
            end = text.rfind(final) if final else -1
            if end < 0:
                raise ChatTemplateError("continue_final_message: the rendered prompt does not contain the final "
                                        "message's content")
            text = text[:end + len(final)]
        return text


def chat_template_for(tokenizer, path: str | None = None) -> ChatTemplate | None:
    """The template chat requests are rendered with: `path` (--chat-template), else the tokenizer's own, else the
    built-in one for the byte tokenizer of the embedded models; None for a checkpoint that ships none. ValueError
    naming the file or the checkpoint's template when it is not valid Jinja."""
    if path is not None:
        return ChatTemplate.from_file(path, tokenizer.special_tokens)
    if tokenizer.chat_template is not None:
        try:
            return ChatTemplate(tokenizer.chat_template, tokenizer.special_tokens)
        except ValueError as error:
            raise ValueError(f"the checkpoint's chat template (tokenizer_config.json): {error}") from None
    from fastdeploy.tokenizer import ByteTokenizer
    return ChatTemplate() if isinstance(tokenizer, ByteTokenizer) else None


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """The token ids of a rendered chat prompt, as transformers' `apply_chat_template(tokenize=True)` and vLLM give
    them: the template's text encoded without added special tokens, so BOS is there exactly where the template
    writes it (never added by a tokenizer whose config adds BOS to plain text, never doubled). A BOS without a text
    form (the embedded models' byte tokenizer) is added, as the models were trained with it."""
    return tokenizer.encode(text, add_special_tokens=tokenizer.special_tokens.get("bos_token") == "")
