"""Renders chat messages into prompt text with a Jinja chat template (docs/serving.md, "Chat template").

Templates are rendered as Hugging Face's `apply_chat_template` and vLLM render them: a sandboxed Jinja environment
with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, `raise_exception` and `strftime_now` as
globals, a `tojson` filter, and the variables `messages` (dicts with `role`, `content` and `name` when given),
`add_generation_prompt`, `bos_token`, `eos_token`, `pad_token` and `tools` (always none here).

The embedded models were trained on plain text, so the built-in template is deliberately small: each message
becomes `<|role|>\n{content}\n`, and with `add_generation_prompt` the prompt ends with `<|assistant|>\n`. Their
byte-level tokenizer has no text form of its special tokens, so `bos_token` and the others are empty strings and
the server adds the BOS id when it tokenises the rendered prompt.
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

    def __init__(self, source: str = BUILTIN_TEMPLATE):
        self.source = source
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(f"not a valid Jinja template: line {error.lineno}: {error.message}") from None

    @classmethod
    def from_file(cls, path: str) -> ChatTemplate:
        """ValueError naming the file when it cannot be read or is not a valid Jinja template."""
        try:
            return cls(Path(path).read_text(encoding="utf-8"))
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
            text = self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token="", eos_token="", pad_token="", tools=None)
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
