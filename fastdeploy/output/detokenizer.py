"""Turns a request's output token ids into text increments under the OpenAI stop-string convention.

The returned text never contains EOS (special tokens have no text), and ends before the first stop string
(`include_stop_str_in_output`: right after it), wherever the token boundaries fall: the text is searched for the
stop strings, and `stopped` tells the caller to end the request there (the engine's own stop matches token ids,
which a stop string spanning other token boundaries escapes). Text that could still turn out to be the start of a
stop string is held back, and so is a trailing U+FFFD (a UTF-8 character, or a byte-fallback sequence, cut between
two steps), so streamed increments concatenate to exactly the non-streamed text and never hold half a character.

Tokens are decoded in a window, as vLLM does with its prefix and read offsets: the tokens not yet turned into text,
after a few tokens of context (the prompt's last ones, then the output's last converted ones) whose own text is cut
off: a tokenizer's text of a token can depend on what precedes it (sentencepiece drops the space of a `▁` that
starts the text), and this way each token reads as it does in the middle of the text (the prompt's text + the
output's text is the text of all the tokens). Every push costs a bounded amount of decoding, so a request's text
costs linear time whatever is held back (round 5 decoded everything held again on every push: quadratic):
- a window whose text ends with U+FFFD keeps only its last tokens (at most HOLD_TOKENS) unconverted: of UTF-8 text
  only the U+FFFD of a cut character can still change (at most 3 of them: it is at most 4 bytes), so the text
  before it is converted as soon as a split of the window reproduces it; a final U+FFFD is released once
  HOLD_TOKENS more tokens have left it where it is (a U+FFFD the model wrote, or bytes no token will complete);
- held stop-string prefixes are at most the longest stop string long, and stop strings are searched only in the
  text not released yet.
"""
from __future__ import annotations

from collections.abc import Sequence

CONTEXT_TOKENS = 4   # enough for a tokenizer's text of a token to not depend on what lies further back
HOLD_TOKENS = 3      # a UTF-8 character cut after its first byte is complete within 3 more byte tokens
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Token ids in (`push`), released text out. The ids are kept (`_ids`: the prompt's last CONTEXT_TOKENS, then the
    output); `_read` is where the tokens not yet turned into text start, and the text they turned into waits in
    `_unreleased` while a stop string may start in it."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), include_stop_str_in_output: bool = False,
                 prompt_token_ids: Sequence[int] = (), min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.stopped = False                # a stop string was found: the text is complete
        self._ids = list(prompt_token_ids)[-CONTEXT_TOKENS:]
        self._first_output = len(self._ids)  # index in _ids of output token 0
        self._read = len(self._ids)          # first token whose text is not converted yet
        self._context, self._context_text = 0, ""   # _ids[_context:_read] is the window's context
        self._set_context()
        self._converted = 0                  # characters of output text converted so far
        self._unreleased = ""                # the converted text not released yet (its end)
        self._final_replacement: tuple[int, int] | None = None   # (its end in the text, tokens when first seen)
        # A stop string counts only when it ends after the text of the tokens before token min_tokens (the engine
        # stops on neither EOS nor a stop before min_tokens, nor does vLLM): that many characters, once known.
        self._floor_index = self._first_output + max(min_tokens - 1, 0)
        self._floor: int | None = 0 if min_tokens <= 1 else None

    def push(self, token_ids: list[int]) -> str:
        """Add new tokens; returns the text that can be released now (nothing once `stopped`)."""
        if self.stopped:
            return ""
        self._ids.extend(token_ids)
        self._convert(final=False)
        found = self._find_stop()
        if found is not None:
            return self._stop_at(found)
        return self._release(len(self._unreleased) - self._stop_prefix_len())

    def push_until_stop(self, token_ids: list[int]) -> tuple[str, int]:
        """`push`, and how many of `token_ids` the request emitted: all of them, or those up to the one whose text
        completed a stop string. Every path ends a request there and counts that many tokens (and logprobs),
        whichever step or token boundaries the engine stopped at."""
        if self.stopped:
            return "", 0
        if not self.stop:
            return self.push(token_ids), len(token_ids)
        text = ""
        for i, token in enumerate(token_ids):   # one at a time: the token that completes the stop is the last one
            text += self.push([token])
            if self.stopped:
                return text, i + 1
        return text, len(token_ids)

    def finish(self, finish_reason: str | None) -> str:
        """The request ended: the rest of the text (the stop string that ended it is never released early, so a
        stop found now is cut here)."""
        if self.stopped:
            return ""
        self._convert(final=True)
        found = self._find_stop()
        if found is not None:
            return self._stop_at(found)
        return self._release(len(self._unreleased))

    # ---- tokens to text ----

    def _set_context(self) -> None:
        start = max(self._read - CONTEXT_TOKENS, 0)
        text = self.tokenizer.decode(self._ids[start:self._read]) if start < self._read else ""
        if text.endswith(_REPLACEMENT):   # a cut character: what follows would change the context's text
            start, text = self._read, ""
        self._context, self._context_text = start, text

    def _window_text(self, end: int) -> str:
        """The text the tokens _ids[_read:end] add after the context."""
        if self._context == self._read:
            return self.tokenizer.decode(self._ids[self._read:end])
        full = self.tokenizer.decode(self._ids[self._context:end])
        if full.startswith(self._context_text):
            return full[len(self._context_text):]
        return self.tokenizer.decode(self._ids[self._read:end])   # a tokenizer whose context text changed

    def _convert(self, final: bool) -> None:
        """Turn the tokens whose text can no longer change into text (all of them when `final`)."""
        end = len(self._ids)
        if self._read == end:
            return
        text = self._window_text(end)
        if not final and text.endswith(_REPLACEMENT) and not self._replacement_is_settled(text):
            end, text = self._stable_split(text)
            if end == self._read:
                return
        self._advance(end, text)

    def _replacement_is_settled(self, text: str) -> bool:
        """The window's final U+FFFD has stayed where it is for HOLD_TOKENS tokens: release it."""
        position = self._converted + len(text)
        if self._final_replacement is None or self._final_replacement[0] != position:
            self._final_replacement = (position, len(self._ids))
        return len(self._ids) - self._final_replacement[1] >= HOLD_TOKENS

    def _stable_split(self, text: str) -> tuple[int, str]:
        """The longest start of the window, short of its last 1..HOLD_TOKENS tokens, whose text is `text` short of
        at least its trailing U+FFFD that later tokens may still change (a cut character: Python's decoder writes
        one U+FFFD for it, sentencepiece one per byte, at most 3); (_read, "") when none is."""
        run = len(text) - len(text.rstrip(_REPLACEMENT))
        limit = len(text) - min(run, HOLD_TOKENS)
        for k in range(1, min(HOLD_TOKENS, len(self._ids) - self._read - 1) + 1):
            part = self._window_text(len(self._ids) - k)
            if len(part) <= limit and text.startswith(part):
                return len(self._ids) - k, part
        return self._read, ""

    def _advance(self, end: int, text: str) -> None:
        if self._floor is None and end > self._floor_index:
            before = self._window_text(self._floor_index) if self._floor_index > self._read else ""
            self._floor = self._converted + len(before)
        self._unreleased += text
        self._converted += len(text)
        self._read = end
        self._set_context()

    # ---- stop strings ----

    def _find_stop(self) -> int | None:
        """Where the released text ends when a stop string occurs in the unreleased text: the start of the first
        one (its end with include_stop_str_in_output); None when there is none. No part of a stop string is ever
        released before the whole is seen (the start of one is held back), so the unreleased text is all there is
        to search, and not before what the tokens before token min_tokens wrote."""
        if not self.stop or self._floor is None:
            return None
        text, base = self._unreleased, self._converted - len(self._unreleased)
        best = None
        for s in self.stop:
            at = text.find(s, max(0, self._floor - len(s) + 1 - base))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, at + len(s))
        if best is None:
            return None
        return best[1] if self.include_stop_str_in_output else best[0]

    def _stop_prefix_len(self) -> int:
        """Length of the longest suffix of the unreleased text that is a prefix of a stop string (held back; also
        with include_stop_str_in_output: found whole later)."""
        text, best = self._unreleased, 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _stop_at(self, end: int) -> str:
        self.stopped = True
        piece, self._unreleased = self._unreleased[:end], ""
        return piece

    def _release(self, end: int) -> str:
        piece, self._unreleased = self._unreleased[:end], self._unreleased[end:]
        return piece


def ends_with_a_stop_seq(token_ids: Sequence[int], stop_seqs: Sequence[Sequence[int]]) -> bool:
    """The output ends with a stop string's own ids: the engine's id match ends the request by itself."""
    return any(len(seq) and list(token_ids[-len(seq):]) == list(seq) for seq in stop_seqs)


def completion_text(tokenizer, token_ids: list[int], stop: tuple[str, ...], finish_reason: str | None,
                    include_stop_str_in_output: bool = False, prompt_token_ids: Sequence[int] = (),
                    min_tokens: int = 0) -> str:
    """The whole text of a finished request (what the streamed increments add up to)."""
    detokenizer = IncrementalDetokenizer(tokenizer, stop, include_stop_str_in_output, prompt_token_ids, min_tokens)
    return detokenizer.push(token_ids) + detokenizer.finish(finish_reason)
