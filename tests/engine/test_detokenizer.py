"""The OpenAI stop-string convention of the detokenizer (SERVICES §3): however the tokens are
split into steps, the increments concatenate to the whole text; the stop string that ended a request is not in
it unless include_stop_str_in_output; a UTF-8 character cut between steps is never emitted half."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdeploy.model_executor.models.tokenizer import BOS_ID, EOS_ID, ByteTokenizer
from fastdeploy.output.detokenizer import IncrementalDetokenizer, completion_text

TOKENIZER = ByteTokenizer()


def _stream(ids: list[int], cuts: list[int], stop, reason, include=False) -> list[str]:
    detokenizer = IncrementalDetokenizer(TOKENIZER, stop, include)
    bounds = [0, *sorted(c % (len(ids) + 1) for c in cuts), len(ids)]
    pieces = [detokenizer.push(ids[a:b]) for a, b in zip(bounds, bounds[1:])]
    return pieces + [detokenizer.finish(reason)]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(text=st.text(alphabet="abé€ xy", max_size=20), stop=st.sampled_from(["", "x", "xy", "é€"]),
       cuts=st.lists(st.integers(0, 100), max_size=6), include=st.booleans())
def test_increments_concatenate_to_the_text_without_the_stop_string(text, stop, cuts, include):
    """Ending with the stop string (then EOS, as the stop op does): the text is everything before its first
    occurrence (or up to its end when include_stop_str_in_output); increments are never half a character."""
    stops = (stop,) if stop else ()
    ids = TOKENIZER.encode(text + stop, add_special_tokens=False) + ([EOS_ID] if stop else [])
    reason = "stop" if stop else "length"
    pieces = _stream(ids, cuts, stops, reason, include)
    first = (text + stop).find(stop) if stop else len(text)
    assert "".join(pieces) == (text + stop)[:first + len(stop) if include else first]
    assert "".join(pieces) == completion_text(TOKENIZER, ids, stops, reason, include)
    assert all("\ufffd" not in p for p in pieces)


def test_text_that_only_looks_like_a_stop_prefix_is_released_at_the_end():
    """Held-back text that never became the stop string is returned when the request ends by length."""
    pieces = _stream(TOKENIZER.encode("abcx", add_special_tokens=False), [4], ("xy",), "length")
    assert pieces == ["abc", "", "x"]   # pushed "abc" then "x" (held back), finished


class CountingTokenizer:
    """ByteTokenizer that counts the token ids it is asked to decode (the work, without timing it)."""

    def __init__(self):
        self.decoded = 0

    def decode(self, ids):
        self.decoded += len(ids)
        return TOKENIZER.decode(ids)


PUSHES = 16_000
WORK_PER_PUSH = 32   # decoded ids per push allowed: a bounded window (context + held tokens + splits)


@pytest.mark.parametrize("case", ["stop-prefix", "replacement"])
def test_16k_held_back_pushes_decode_linear_work(case):
    """Text held back at every push (output "aaaa…" under stop ["ab"], whose every "a" may start
    the stop string; or byte 0x80, U+FFFD, at every push) still decodes a bounded number of ids per push, so 16k
    pushes cost linear work (round 5 decoded everything held again: quadratic, 21 s for the U+FFFD case). The
    bound is checked after every push, so a quadratic detokenizer fails within a few dozen pushes. The text is
    still whole at the end."""
    tokenizer = CountingTokenizer()
    token, stop = (ord("a"), ("ab",)) if case == "stop-prefix" else (0x80, ())
    detokenizer = IncrementalDetokenizer(tokenizer, stop, prompt_token_ids=TOKENIZER.encode("say:"))
    pieces = []
    for i in range(PUSHES):
        pieces.append(detokenizer.push([token]))
        assert tokenizer.decoded <= WORK_PER_PUSH * (i + 2), f"{tokenizer.decoded} ids decoded in {i + 1} pushes"
    pieces.append(detokenizer.finish("length"))
    assert "".join(pieces) == ("a" if case == "stop-prefix" else "\ufffd") * PUSHES


def test_a_trailing_replacement_character_is_released_within_4_tokens():
    """A U+FFFD at the end of the text is held only while a later token may still complete its character (a UTF-8
    character is at most 4 bytes): byte 0x80 at every push releases each U+FFFD within 4 tokens of its own, and a
    U+FFFD the model wrote (its three bytes) followed by tokens with no text (BOS) is released by the fourth token
    from its first byte (round 5 held both until some other character followed)."""
    detokenizer = IncrementalDetokenizer(TOKENIZER)
    released = ""
    for i in range(1, 13):
        released += detokenizer.push([0x80])
        assert released.count("\ufffd") >= i - 3, (i, released)
    detokenizer = IncrementalDetokenizer(TOKENIZER)
    pieces = [detokenizer.push([token]) for token in [*"\ufffd".encode(), BOS_ID]]
    assert "".join(pieces) == "\ufffd", pieces
