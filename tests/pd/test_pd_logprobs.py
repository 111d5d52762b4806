"""t0's logprobs across the hop (docs/design.md §6 decision 11): D's list starts with P's entry for t0, and a
request that asks for logprobs fails with a clear error, holding nothing, when its hand-off carries none."""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.connector import prefill
from tests.e2e.workloads import TOY_ENGINE

MTP = {"method": "mtp", "num_speculative_tokens": 1}


def test_d_starts_with_the_t0_entry_p_computed(monkeypatch):
    """The entry D reports for t0 is the one P put in the hand-off (D never computes t0's distribution)."""
    sent = []
    create = prefill.HandoffMessage.create

    def recording_create(**fields):
        sent.append(fields["t0_logprobs"])
        return create(**fields)

    monkeypatch.setattr(prefill.HandoffMessage, "create", recording_create)
    out = LLM(speculative_config=MTP, splitwise=True, **TOY_ENGINE).generate(
        ["hello"], SamplingParams(max_tokens=8, min_tokens=8, logprobs=4), use_tqdm=False)[0]
    assert sent[0] is not None and out.outputs.logprobs[0] == sent[0]
    assert [e.token_id for e in out.outputs.logprobs] == out.outputs.token_ids and len(out.outputs.token_ids) == 8


@pytest.mark.parametrize("max_tokens", [1, 8])
def test_a_hand_off_without_t0_logprobs_fails_a_request_that_asks(monkeypatch, max_tokens):
    """P built without logprobs (simulated: the field dropped) cannot serve a request that asks: D fails it at
    receipt naming the field, for a hand-off D decodes (max_tokens 8) and one it finishes at t0 (max_tokens 1);
    a request that does not ask is unaffected; both instances end with everything free."""
    create = prefill.HandoffMessage.create
    monkeypatch.setattr(prefill.HandoffMessage, "create", lambda **fields: create(**{**fields, "t0_logprobs": None}))
    llm = LLM(speculative_config=MTP, splitwise=True, **TOY_ENGINE)
    asks, plain = llm.generate(["hello", "world"], [SamplingParams(max_tokens=max_tokens, logprobs=2),
                                                    SamplingParams(max_tokens=max_tokens)], use_tqdm=False)
    assert asks.outputs.finish_reason == "abort" and "t0_logprobs" in asks.error
    assert plain.error is None and plain.outputs.finish_reason in ("stop", "length")
    for name, stats in llm.resource_stats().items():
        assert (stats.free_slots, stats.free_kv_blocks, stats.running_requests) == \
            (stats.total_slots, stats.total_kv_blocks, 0), name
