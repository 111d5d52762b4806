"""LLMEngine.abort: a waiting request finishes at once; a running one is stopped through the preemption path and
frees its slot and KV blocks in the next step; other requests are unaffected (SERVICES §3 "client that
disconnects", PD_MTP_FLOW §6 and §7.2)."""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.schema.request import RequestStatus

PARAMS = SamplingParams(max_tokens=24, min_tokens=24)


def _llm(k: int, slots: int = 2) -> LLM:
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    return LLM(model="fd-toy", speculative_config=spec, max_num_seqs=slots, max_model_len=64)


def _prompt(llm: LLM, text: str) -> list[int]:
    return llm.tokenizer.encode(text)


@pytest.mark.parametrize("k", [0, 1])
def test_abort_running_request_frees_slot_and_blocks_in_one_step(k):
    """SERVICES §3: an aborted running request holds no slot or block after the next step; the other request's
    greedy output equals its output alone."""
    solo = _llm(k).generate("other request", PARAMS, use_tqdm=False)[0].outputs.token_ids
    llm = _llm(k)
    engine = llm.engine
    victim = engine.add_request("victim", _prompt(llm, "victim request"), PARAMS)
    other = engine.add_request("other", _prompt(llm, "other request"), PARAMS)
    for _ in range(3):
        engine.step()
    assert victim.status is RequestStatus.RUNNING and victim.block_ids
    assert engine.abort("victim", error="client went away")
    finished = engine.step()
    assert victim in finished
    assert (victim.finish_reason, victim.error, victim.slot, victim.block_ids) == ("abort", "client went away",
                                                                                   None, [])
    stats = engine.stats()
    assert stats.free_slots == stats.total_slots - 1
    assert stats.free_kv_blocks == stats.total_kv_blocks - len(other.block_ids)
    while engine.has_unfinished():
        engine.step()
    assert other.finish_reason == "length" and other.output_token_ids == solo
    assert engine.stats().free_kv_blocks == engine.stats().total_kv_blocks


def test_abort_waiting_request_finishes_at_once_and_holds_nothing():
    """A waiting request holds nothing: abort finishes it in the call, with finish reason "abort"."""
    llm = _llm(1, slots=1)
    engine = llm.engine
    engine.add_request("first", _prompt(llm, "first"), PARAMS)
    queued = engine.add_request("queued", _prompt(llm, "queued"), PARAMS)
    engine.step()
    before = engine.stats()
    assert engine.num_waiting() == 1
    assert engine.abort("queued")
    assert (queued.status, queued.finish_reason, queued.error) == (RequestStatus.FINISHED, "abort", "aborted")
    assert engine.num_waiting() == 0 and engine.stats() == before


def test_abort_of_unknown_finished_or_aborting_request_returns_false():
    """abort returns False for an id that is not live, and for a second abort of the same request."""
    llm = _llm(0)
    engine = llm.engine
    done = engine.add_request("done", _prompt(llm, "done"), SamplingParams(max_tokens=1))
    engine.add_request("live", _prompt(llm, "live"), PARAMS)
    engine.step()
    assert done.status is RequestStatus.FINISHED
    assert not engine.abort("done") and not engine.abort("nobody")
    assert engine.abort("live") and not engine.abort("live")
