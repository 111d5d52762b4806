"""The OpenAI stop-string convention of the detokenizer (SERVICES §3): however the tokens are
split into steps, the increments concatenate to the whole text; the stop string that ended a request is not in
it unless include_stop_str_in_output; a UTF-8 character cut between steps is never emitted half."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fastdeploy.model_executor.models.tokenizer import EOS_ID, ByteTokenizer
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
