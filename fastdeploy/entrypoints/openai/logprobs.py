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
    """A token's text in a logprobs object (`Tokenizer.token_text`: its characters, `<0xNN>` for bytes that are no
    whole character, a special token's spelling); distinct ids get distinct texts, so {text: logprob} maps lose
    nothing."""
    return tokenizer.token_text(token_id)


def token_bytes(tokenizer, token_id: int) -> list[int] | None:
    """The bytes a token adds to the text; None for a special token, which adds none."""
    data = tokenizer.token_bytes(token_id)
    return None if data is None else list(data)


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
            self._offset += len(self._decoder.decode(bytes(token_bytes(self.tokenizer, entry.token_id) or ())))
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
                          bytes=token_bytes(self.tokenizer, token_id))

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
