"""Logprobs between the engine core and the API server (SERVICES §1, docs/design.md §5 "Logprobs"): each delta
carries the entries of its new tokens only, they concatenate to the request's list, survive the MessagePack encoding bit
for bit, and a malformed list is a ValueError naming the field."""
from __future__ import annotations

import msgspec
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.engine_core import EngineCore
from fastdeploy.schema.core_protocol import (AddRequest, EngineStats, RequestDelta, StepOutputs, decode_message,
                                             encode_message)
from fastdeploy.schema.request import TokenLogprob

STATS = EngineStats(0, 0, 1, 1, 1, 1)


def _frame(delta: dict) -> bytes:
    """A StepOutputs frame with one delta given as plain MessagePack data (not built from the structs)."""
    stats = {name: getattr(STATS, name) for name in STATS.__struct_fields__}
    return msgspec.msgpack.encode({"type": "StepOutputs", "deltas": [delta], "stats": stats})


@pytest.mark.parametrize("k", [0, 2])
def test_deltas_carry_the_new_tokens_logprobs_in_order(k):
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    want = LLM(model="fd-toy", speculative_config=spec).generate(
        ["Hello", "abc"], [SamplingParams(max_tokens=12, min_tokens=12, logprobs=3), SamplingParams(max_tokens=12)],
        use_tqdm=False)
    core = EngineCore(LLM(model="fd-toy", speculative_config=spec).engine)
    core.handle(AddRequest("a", [256, *b"Hello"], {"max_tokens": 12, "min_tokens": 12, "logprobs": 3}))
    core.handle(AddRequest("b", [256, *b"abc"], {"max_tokens": 12}))
    deltas = []
    while core.has_work:
        deltas += decode_message(encode_message(core.step())).deltas   # through the wire encoding
    mine = [d for d in deltas if d.request_id == "a"]
    assert all(len(d.new_logprobs) == len(d.new_token_ids) for d in mine)
    assert [e for d in mine for e in d.new_logprobs] == want[0].outputs.logprobs
    assert len(want[0].outputs.logprobs) == 12 and sum(bool(d.new_token_ids) for d in mine) > 1
    assert all(d.new_logprobs is None for d in deltas if d.request_id == "b")


def test_logprobs_survive_the_wire_encoding_bit_for_bit():
    entries = [TokenLogprob(5, -1e-300, (5, 9), (-1e-300, -745.1332191019411)), TokenLogprob(9, -0.0)]
    message = StepOutputs(deltas=[RequestDelta("r", [5, 9], new_logprobs=entries)], stats=STATS)
    assert decode_message(encode_message(message)).deltas[0].new_logprobs == entries


@pytest.mark.parametrize("value,why", [
    ([[5, -1.0, [], []]], "'new_logprobs' must name exactly the tokens"),
    ([[5, -1.0, [], []], [8, -1.0, [], []]], "'new_logprobs' must name exactly the tokens"),
    ([[5, -1.0, [1], []], [9, -1.0, [], []]], "top_token_ids"),
    ([[5, 1.0, [], []], [9, -1.0, [], []]], "logprob"),
    ([[5], [9, -1.0, [], []]], "new_logprobs"),
    ("x", "new_logprobs"),
])
def test_malformed_new_logprobs_are_refused_naming_the_field(value, why):
    frame = _frame({"request_id": "r", "new_token_ids": [5, 9], "new_logprobs": value})
    with pytest.raises(ValueError, match=why):
        decode_message(frame)
