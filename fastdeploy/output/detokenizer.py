"""Turns a request's output token ids into text increments under the OpenAI stop-string convention.

The returned text never contains EOS, and never the stop string that ended the request unless
`include_stop_str_in_output` is set: text that could still turn out to be (the start of) a stop string is held back
until the request finishes, so streamed increments concatenate to exactly the non-streamed text. Trailing
U+FFFD (a UTF-8 character cut between two steps) is held back too.
"""
from __future__ import annotations


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: tuple[str, ...] = (), include_stop_str_in_output: bool = False):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self._ids: list[int] = []
        self._released = 0          # characters of the decoded text already returned
        self.text = ""              # everything returned so far

    def push(self, token_ids: list[int]) -> str:
        """Add new tokens; returns the text that can be released now."""
        self._ids.extend(token_ids)
        full = self.tokenizer.decode(self._ids)
        end = len(full)
        while end > self._released and full[end - 1] == "\ufffd":
            end -= 1
        if not self.include_stop_str_in_output:
            end -= self._stop_prefix_len(full[:end])
        return self._release(full, max(end, self._released))

    def finish(self, finish_reason: str | None) -> str:
        """The request ended: the rest of the text, without the stop string that ended it."""
        full = self.tokenizer.decode(self._ids)
        if finish_reason == "stop" and not self.include_stop_str_in_output:
            for s in self.stop:
                if full.endswith(s):
                    full = full[:-len(s)]
                    break
        return self._release(full, max(len(full), self._released))

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` (past what was released) that is a prefix of a stop string."""
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
        self.text += piece
        return piece


def completion_text(tokenizer, token_ids: list[int], stop: tuple[str, ...], finish_reason: str | None,
                    include_stop_str_in_output: bool = False) -> str:
    """The whole text of a finished request (what the streamed increments add up to)."""
    detokenizer = IncrementalDetokenizer(tokenizer, stop, include_stop_str_in_output)
    return detokenizer.push(token_ids) + detokenizer.finish(finish_reason)
