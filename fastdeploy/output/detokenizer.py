"""Turns a request's output token ids into text increments under the OpenAI stop-string convention.

The returned text never contains EOS (special tokens have no text), and ends before the first stop string
(`include_stop_str_in_output`: right after it), wherever the token boundaries fall: the text is searched for the
stop strings, and `stopped` tells the caller to end the request there (the engine's own stop matches token ids,
which a stop string spanning other token boundaries escapes). Text that could still turn out to be the start of a
stop string is held back, and so is trailing U+FFFD (a UTF-8 character, or a byte-fallback sequence, cut between
two steps), so streamed increments concatenate to exactly the non-streamed text and never hold half a character.

Tokens are decoded after a few tokens of context (the prompt's last ones, then the output's last released ones)
and the context's own text is cut off: a tokenizer's text of a token can depend on what precedes it (sentencepiece
drops the space of a `▁` that starts the text), and this way each token reads as it does in the middle of the text
(the prompt's text + the output's text is the text of all the tokens, as vLLM decodes).
"""
from __future__ import annotations

from collections.abc import Sequence

CONTEXT_TOKENS = 4   # enough for a tokenizer's text of a token to not depend on what lies further back


class IncrementalDetokenizer:
    """Only the tokens not yet fully released are decoded again on each push (`_pending`, after the context), so
    a request's text costs linear time."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), include_stop_str_in_output: bool = False,
                 prompt_token_ids: Sequence[int] = (), min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.min_tokens = min_tokens        # a stop string counts only when it ends in token min_tokens or later
        self.stopped = False                # a stop string was found: the text is complete
        self._pending: list[int] = []       # tokens whose text is not (entirely) released yet
        self._released = 0                  # characters of the pending text already returned
        self._num_tokens = 0                # output tokens pushed so far
        self._set_context(list(prompt_token_ids)[-CONTEXT_TOKENS:])

    def _set_context(self, ids: list[int]) -> None:
        text = self.tokenizer.decode(ids) if ids else ""
        if text.endswith("\ufffd"):         # a cut character: what follows would change the context's text
            ids, text = [], ""
        self._context, self._context_text = ids, text

    def _text(self, count: int | None = None) -> str:
        """The text the pending tokens (the first `count` of them) add after the context."""
        pending = self._pending if count is None else self._pending[:count]
        if not self._context:
            return self.tokenizer.decode(pending)
        full = self.tokenizer.decode(self._context + pending)
        if full.startswith(self._context_text):
            return full[len(self._context_text):]
        return self.tokenizer.decode(pending)   # a tokenizer whose context text changed: decode alone

    def _stop_floor(self) -> int | None:
        """Characters of the pending text a stop string must end after: the text of the tokens before token
        min_tokens (the engine stops on neither EOS nor a stop before min_tokens, nor does vLLM); None while
        token min_tokens has not come."""
        first = self._num_tokens - len(self._pending)     # output index of the first pending token
        before = self.min_tokens - 1 - first              # pending tokens before token min_tokens
        if before <= 0:
            return 0
        return len(self._text(before)) if before < len(self._pending) else None

    def push(self, token_ids: list[int]) -> str:
        """Add new tokens; returns the text that can be released now (nothing once `stopped`)."""
        if self.stopped:
            return ""
        self._pending.extend(token_ids)
        self._num_tokens += len(token_ids)
        full = self._text()
        found = self._find_stop(full)
        if found is not None:
            self.stopped = True
            return self._release(full, max(found, self._released))
        end = len(full)
        while end > self._released and full[end - 1] == "\ufffd":
            end -= 1
        end -= self._stop_prefix_len(full[:end])     # also with include_stop_str_in_output: found whole later
        piece = self._release(full, max(end, self._released))
        if self._released == len(full) and not full.endswith("\ufffd"):
            self._set_context((self._context + self._pending)[-CONTEXT_TOKENS:])
            self._pending, self._released = [], 0
        return piece

    def finish(self, finish_reason: str | None) -> str:
        """The request ended: the rest of the text (the stop string that ended it is never released early, so a
        stop found now is cut here)."""
        if self.stopped:
            return ""
        full = self._text()
        found = self._find_stop(full)
        if found is not None:
            self.stopped = True
            full = full[:found]
        return self._release(full, max(len(full), self._released))

    def _find_stop(self, text: str) -> int | None:
        """Where the released text ends when a stop string occurs in the text: the start of the first one (its
        end with include_stop_str_in_output); None when there is none. No part of a stop string is ever released
        before the whole is seen (the start of one is held back), so the search starts at the unreleased text, and
        not before what the tokens before token min_tokens wrote."""
        floor = self._stop_floor() if self.stop else None
        if floor is None:
            return None
        best = None
        for s in self.stop:
            at = text.find(s, max(self._released, floor - len(s) + 1))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, at + len(s))
        if best is None:
            return None
        return best[1] if self.include_stop_str_in_output else best[0]

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest unreleased suffix of `text` that is a prefix of a stop string."""
        room = len(text) - self._released
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, room), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _release(self, full: str, end: int) -> str:
        piece = full[self._released:end]
        self._released = end
        return piece


def completion_text(tokenizer, token_ids: list[int], stop: tuple[str, ...], finish_reason: str | None,
                    include_stop_str_in_output: bool = False, prompt_token_ids: Sequence[int] = (),
                    min_tokens: int = 0) -> str:
    """The whole text of a finished request (what the streamed increments add up to)."""
    detokenizer = IncrementalDetokenizer(tokenizer, stop, include_stop_str_in_output, prompt_token_ids, min_tokens)
    return detokenizer.push(token_ids) + detokenizer.finish(finish_reason)
