"""Turns a request's output token ids into text increments under the OpenAI stop-string convention.

The returned text never contains EOS, and never the stop string that ended the request unless
`include_stop_str_in_output` is set: text that could still turn out to be (the start of) a stop string is held back
until the request finishes, so streamed increments concatenate to exactly the non-streamed text. Trailing
U+FFFD (a UTF-8 character cut between two steps) is held back too.
"""
from __future__ import annotations


class IncrementalDetokenizer:
    """Only the tokens not yet fully released are decoded again on each push (`_pending`), so a request's text
    costs linear time: once everything decoded so far is released, the pending tokens are dropped."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), include_stop_str_in_output: bool = False):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self._pending: list[int] = []   # tokens whose text is not (entirely) released yet
        self._released = 0              # characters of decode(_pending) already returned

    def push(self, token_ids: list[int]) -> str:
        """Add new tokens; returns the text that can be released now."""
        self._pending.extend(token_ids)
        full = self.tokenizer.decode(self._pending)
        end = len(full)
        while end > self._released and full[end - 1] == "\ufffd":
            end -= 1
        if not self.include_stop_str_in_output:
            end -= self._stop_prefix_len(full[:end])
        piece = self._release(full, max(end, self._released))
        if self._released == len(full) and not full.endswith("\ufffd"):
            self._pending, self._released = [], 0
        return piece

    def finish(self, finish_reason: str | None) -> str:
        """The request ended: the rest of the text, without the stop string that ended it (the stop string is
        never released early, so it lies in the pending text)."""
        full = self.tokenizer.decode(self._pending)
        if finish_reason == "stop" and not self.include_stop_str_in_output:
            for s in self.stop:
                if full.endswith(s) and len(full) - len(s) >= self._released:
                    full = full[:-len(s)]
                    break
        return self._release(full, max(len(full), self._released))

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest unreleased suffix of `text` that is a prefix of a stop string."""
        room = len(text) - self._released
        best = 0
        for s in self.stop:
            for k in range(min(len(s), room), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _release(self, full: str, end: int) -> str:
        piece = full[self._released:end]
        self._released = end
        return piece


def completion_text(tokenizer, token_ids: list[int], stop: tuple[str, ...], finish_reason: str | None,
                    include_stop_str_in_output: bool = False) -> str:
    """The whole text of a finished request (what the streamed increments add up to)."""
    detokenizer = IncrementalDetokenizer(tokenizer, stop, include_stop_str_in_output)
    return detokenizer.push(token_ids) + detokenizer.finish(finish_reason)
