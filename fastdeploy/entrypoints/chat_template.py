"""Renders chat messages into the prompt text of the embedded models (docs/serving.md, "Chat template").

The embedded models were trained on plain text, so the template is deliberately small: each message becomes
`<|role|>\n{content}\n`, and the prompt ends with `<|assistant|>\n` so the model continues as the assistant.
"""
from __future__ import annotations

ROLES = ("system", "user", "assistant")


def render_chat(messages: list[tuple[str, str]]) -> str:
    """`messages`: (role, content) pairs in order. Raises ValueError naming the bad entry."""
    if not messages:
        raise ValueError("render_chat: argument 'messages' must hold at least one message")
    parts = []
    for i, (role, content) in enumerate(messages):
        if role not in ROLES:
            raise ValueError(f"render_chat: 'messages[{i}].role' must be one of {ROLES}, got {role!r}")
        parts.append(f"<|{role}|>\n{content}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)
