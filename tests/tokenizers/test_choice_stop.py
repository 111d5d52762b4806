"""A stop string the engine's token-id match misses: the choice asks the engine to end the request once (the
detokenizer found the text), releases no text after it, and reports the engine's closing abort as "stop"; the
choice emitted the tokens up to the one that completed the stop string, whatever the engine computed after it."""
from __future__ import annotations

from fastdeploy.entrypoints.openai.generation import Choice
from fastdeploy.metrics.metrics import ServerMetrics
from fastdeploy.output.detokenizer import IncrementalDetokenizer
from fastdeploy.schema.core_protocol import AddRequest, RequestDelta
from fastdeploy.tokenizer import ByteTokenizer


def test_stop_string_found_in_text_ends_the_engine_request_as_stop():
    tok = ByteTokenizer()
    asked = []
    detokenizer = IncrementalDetokenizer(tok, ("lo w",), False, tok.encode("say:"))
    message = AddRequest(request_id="r", prompt_token_ids=tok.encode("say:"), params={})
    choice = Choice(0, message, None, ServerMetrics().track(), detokenizer, True, stop_engine=lambda: asked.append(1))
    texts = [choice.take(RequestDelta(request_id="r", new_token_ids=tok.encode(part, add_special_tokens=False)))[0]
             for part in ("hel", "lo", " wor", "ld")]
    # "l" may start the stop string: held back until "lo" decides; asked once, nothing after the stop string
    assert texts == ["he", "l", "", ""] and asked == [1]
    last = RequestDelta(request_id="r", new_token_ids=[], finished=True, finish_reason="abort",
                        error="stop string reached", num_prompt_tokens=4, num_output_tokens=11)
    assert choice.take(last)[0] == ""
    # the engine counted 11 ("hello world"); the choice emitted "hello w", 7 tokens
    assert (choice.last.finish_reason, choice.last.error, choice.last.num_output_tokens) == ("stop", None, 7)


def test_a_stop_the_engine_matches_as_token_ids_is_left_to_the_engine():
    """The output ends with the stop string's own ids: the engine stops by itself (and adds its EOS), so the
    choice does not abort it; the EOS after the stop string is not one of the tokens it emitted."""
    tok = ByteTokenizer()
    asked = []
    detokenizer = IncrementalDetokenizer(tok, ("lo w",), False, tok.encode("say:"))
    message = AddRequest(request_id="r", prompt_token_ids=tok.encode("say:"), params={},
                         stop_seqs=[tok.encode("lo w", add_special_tokens=False)])
    choice = Choice(0, message, None, ServerMetrics().track(), detokenizer, True, stop_engine=lambda: asked.append(1))
    for part in ("hel", "lo w"):
        choice.take(RequestDelta(request_id="r", new_token_ids=tok.encode(part, add_special_tokens=False)))
    assert detokenizer.stopped and asked == []
    last = RequestDelta(request_id="r", new_token_ids=[tok.eos_token_id], finished=True, finish_reason="stop",
                        num_prompt_tokens=4, num_output_tokens=8)
    choice.take(last)
    assert choice.last.num_output_tokens == 7
