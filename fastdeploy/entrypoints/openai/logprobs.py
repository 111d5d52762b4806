"""Formats the engine's per-token log probabilities as OpenAI's `logprobs` objects (docs/serving.md, "Logprobs").

Completions get the legacy format (`tokens`, `token_logprobs`, `top_logprobs` as {text: logprob} holding the
chosen token and the top N, `text_offset`); chat gets `content[]` entries (`token`, `logprob`, `bytes`,
`top_logprobs` with the top N). A renderer belongs to one choice: it turns each delta's entries into the piece a
streamed chunk carries, and keeps the whole list for the non-streamed body, so the streamed pieces concatenate to
the non-streamed object.
"""
from __future__ import annotations

import codecs

from fastdeploy.entrypoints.openai.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from fastdeploy.schema.request import TokenLogprob


def token_text(tokenizer, token_id: int) -> str:
    """A token's text in a logprobs object: the character of an ASCII byte; `<0xNN>` for a byte that is no
    character by itself (a piece of a multi-byte UTF-8 character); `<|bos|>`, `<|eos|>`, `<|pad|>` for the special
    ids (the spellings of /tokenize). Distinct ids get distinct texts, so {text: logprob} maps lose nothing."""
    specials = {tokenizer.bos_token_id: "<|bos|>", tokenizer.eos_token_id: "<|eos|>",
                tokenizer.pad_token_id: "<|pad|>"}
    if token_id in specials:
        return specials[token_id]
    return chr(token_id) if token_id < 0x80 else f"<0x{token_id:02X}>"


def token_bytes(token_id: int) -> list[int] | None:
    """The bytes a token adds to the text ([b] for byte id b < 256); None for a special id, which adds none."""
    return [token_id] if token_id < 256 else None


class CompletionLogprobsRenderer:
    """`text_offset` counts the characters of the text decoded before the token (an incremental UTF-8 decoder, as
    the choice's text is decoded), so the bytes of one multi-byte character share its offset."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._offset = 0
        self._all = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])

    def push(self, entries: list[TokenLogprob]) -> CompletionLogprobs | None:
        """The piece for these tokens (None for none)."""
        if not entries:
            return None
        piece = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
        for entry in entries:
            text = token_text(self.tokenizer, entry.token_id)
            top = {text: entry.logprob}
            for token, logprob in zip(entry.top_token_ids, entry.top_logprobs):
                top.setdefault(token_text(self.tokenizer, token), logprob)
            piece.tokens.append(text)
            piece.token_logprobs.append(entry.logprob)
            piece.top_logprobs.append(top)
            piece.text_offset.append(self._offset)
            self._offset += len(self._decoder.decode(bytes(token_bytes(entry.token_id) or ())))
        for name in ("text_offset", "token_logprobs", "tokens", "top_logprobs"):
            getattr(self._all, name).extend(getattr(piece, name))
        return piece

    def result(self) -> CompletionLogprobs:
        return self._all


class ChatLogprobsRenderer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._all = ChatLogprobs(content=[])

    def _top(self, token_id: int, logprob: float) -> TopLogprob:
        return TopLogprob(token=token_text(self.tokenizer, token_id), logprob=logprob,
                          bytes=token_bytes(token_id))

    def push(self, entries: list[TokenLogprob]) -> ChatLogprobs | None:
        if not entries:
            return None
        content = [ChatTokenLogprob(**self._top(e.token_id, e.logprob).model_dump(),
                                    top_logprobs=[self._top(t, lp) for t, lp in zip(e.top_token_ids, e.top_logprobs)])
                   for e in entries]
        self._all.content.extend(content)
        return ChatLogprobs(content=content)

    def result(self) -> ChatLogprobs:
        return self._all
