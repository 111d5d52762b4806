"""The engine core's logic without sockets, and its wire messages (SERVICES §1): deltas add up to the request's
outputs, refusals come back as finished "abort" deltas, PD's disaggregate_info reaches the instance only when
present, and every message survives its JSON encoding while bad frames raise ValueError."""
from __future__ import annotations

import msgspec
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.schema.core_protocol import (AbortRequest, AddRequest, EngineStats, Heartbeat, Ready, RequestDelta,
                                             Shutdown, StepOutputs, decode_message, encode_message)
from fastdeploy.engine.engine_core import EngineCore


def _add(rid: str, prompt: str = "Hello", **params) -> AddRequest:
    return AddRequest(request_id=rid, prompt_token_ids=[256, *prompt.encode()],
                      params={"max_tokens": 12, **params})


def _run(core: EngineCore) -> list[RequestDelta]:
    deltas = []
    while core.has_work:
        deltas += core.step().deltas
    return deltas


@pytest.mark.parametrize("k", [0, 2])
def test_deltas_concatenate_to_the_in_process_output(k):
    """The tokens of a request's deltas, in order, are its LLM output; the last delta carries the figures."""
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    want = LLM(model="fd-toy", speculative_config=spec).generate(["Hello", "abc"], SamplingParams(max_tokens=12),
                                                                 use_tqdm=False)
    core = EngineCore(LLM(model="fd-toy", speculative_config=spec).engine)
    core.handle(_add("a"))
    core.handle(_add("b", "abc"))
    deltas = _run(core)
    for rid, expected in zip("ab", want):
        mine = [d for d in deltas if d.request_id == rid]
        assert [t for d in mine for t in d.new_token_ids] == expected.outputs.token_ids
        assert [d.finished for d in mine] == [False] * (len(mine) - 1) + [True]
        last = mine[-1]
        assert (last.finish_reason, last.num_output_tokens, last.num_decode_rounds, last.num_accepted_drafts) == (
            expected.outputs.finish_reason, len(expected.outputs.token_ids), expected.metrics.num_decode_rounds,
            expected.metrics.num_accepted_drafts)


def test_bad_and_duplicate_requests_come_back_as_rejected_abort_deltas():
    """add_request's ValueError (and a reused live id, and bad sampling fields) become one finished delta with
    finish reason "abort", `rejected` set and the reason in `error`; the good request is unaffected."""
    core = EngineCore(LLM(model="fd-toy").engine)
    core.handle(_add("good"))
    core.handle(_add("good"))
    core.handle(_add("long", max_tokens=10_000))
    core.handle(_add("bad-params", temperature=-1))
    core.handle(_add("bad-field", colour="blue"))
    deltas = _run(core)
    rejected = {d.request_id: d for d in deltas if d.rejected}
    assert sorted(rejected) == ["bad-field", "bad-params", "good", "long"]
    assert all(d.finished and d.finish_reason == "abort" and d.error for d in rejected.values())
    assert "already in use" in rejected["good"].error and "max_model_len" in rejected["long"].error
    assert "temperature" in rejected["bad-params"].error
    assert [d.finish_reason for d in deltas if d.request_id == "good" and d.finished and not d.rejected] == ["length"]


def test_abort_message_finishes_the_request_with_abort():
    """AbortRequest: the request's last delta says "abort" with the given error; the core has no work left."""
    core = EngineCore(LLM(model="fd-toy").engine)
    core.handle(_add("r", max_tokens=200, min_tokens=200))
    core.step()
    core.handle(AbortRequest(request_id="r", error="client gone"))
    last = _run(core)[-1]
    assert (last.request_id, last.finished, last.finish_reason, last.error) == ("r", True, "abort", "client gone")
    stats = core.stats()
    assert stats.free_kv_blocks == stats.total_kv_blocks and stats.free_slots == stats.total_slots


def test_take_in_acknowledges_a_new_request_before_any_step_and_loses_no_token():
    """take_in before every step (as the process loop does): a request added since the last step is acknowledged
    (an empty, unfinished delta) before any step runs, and the deltas still add up to the in-process output."""
    want = LLM(model="fd-toy").generate(["Hello"], SamplingParams(max_tokens=12), use_tqdm=False)[0]
    core = EngineCore(LLM(model="fd-toy").engine)
    assert core.take_in() is None   # nothing live: nothing to report
    core.handle(_add("a"))
    early = core.take_in()
    assert [(d.request_id, d.new_token_ids, d.finished) for d in early.deltas] == [("a", [], False)]
    deltas = list(early.deltas)
    while core.has_work:
        early = core.take_in()
        deltas += early.deltas if early is not None else []
        deltas += core.step().deltas
    assert [t for d in deltas for t in d.new_token_ids] == want.outputs.token_ids
    assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]


@pytest.mark.parametrize("k", [0, 1])
def test_d_reports_the_first_token_at_take_in_before_running_its_model(k):
    """A decode instance's first token (P's t0, in the hand-off) is reported as soon as the hand-off is taken in,
    before D's model runs a step for the request."""
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    want = LLM(model="fd-toy", speculative_config=spec).generate(["Hello"], SamplingParams(max_tokens=12),
                                                                 use_tqdm=False)[0].outputs.token_ids
    pair = LLM(model="fd-toy", speculative_config=spec, splitwise=True).engine
    prefill, decode = pair.prefill, pair.decode
    runs = []
    execute = decode.runner.execute_model
    decode.runner.execute_model = lambda plan: runs.append(plan) or execute(plan)
    core = EngineCore(decode)
    prompt = [256, *b"Hello"]
    info = {"request_id": "r"}
    prefill.add_request("r", prompt, SamplingParams(max_tokens=12), disaggregate_info=info)
    core.handle(AddRequest(request_id="r", prompt_token_ids=prompt, params={"max_tokens": 12},
                           disaggregate_info=info))
    first = None
    for _ in range(100):
        prefill.step()
        early = core.take_in()
        tokens = [t for d in (early.deltas if early is not None else []) for t in d.new_token_ids]
        if tokens:
            first = tokens
            break
        assert not [t for d in core.step().deltas for t in d.new_token_ids]
    assert first is not None and first == want[:len(first)]
    assert runs == []   # D's model has not run for it yet


class _RecordingInstance:
    """Records add_request's keyword arguments; holds no request."""

    def __init__(self):
        self.calls = []

    def add_request(self, request_id, prompt_token_ids, params, stop_seqs=(), prompt=None, **extra):
        self.calls.append(extra)
        raise ValueError("recorded")


def test_disaggregate_info_reaches_add_request_as_sent():
    """Every role's add_request takes `disaggregate_info` (None when the body had none): the connector decides."""
    instance = _RecordingInstance()
    core = EngineCore(instance)
    core.handle(_add("plain"))
    core.handle(AddRequest(request_id="pd", prompt_token_ids=[256, 65], params={},
                           disaggregate_info={"request_id": "pd", "peer": "tcp://127.0.0.1:1"}))
    assert instance.calls == [{"disaggregate_info": None},
                              {"disaggregate_info": {"request_id": "pd", "peer": "tcp://127.0.0.1:1"}}]


def test_a_request_that_breaks_add_request_is_refused_alone():
    """An unexpected exception while admitting one request (here an injected RuntimeError) refuses that request
    with the cause and leaves the core serving the next one."""
    instance = LLM(model="fd-toy").engine
    add = instance.add_request

    def add_or_break(request_id, *args, **kwargs):
        if request_id == "breaks":
            raise RuntimeError("injected fault")
        return add(request_id, *args, **kwargs)

    instance.add_request = add_or_break
    core = EngineCore(instance)
    core.handle(_add("breaks"))
    core.handle(_add("good"))
    deltas = _run(core)
    refused = next(d for d in deltas if d.request_id == "breaks")
    assert refused.rejected and refused.error == "injected fault"
    assert [d.finish_reason for d in deltas if d.request_id == "good" and d.finished] == ["length"]


MESSAGES = [_add("x", stop=["a"]), AbortRequest(request_id="x", error=None), Shutdown(), Ready(info={"pid": 1}),
            Heartbeat(turns=3, busy_s=1.5),
            StepOutputs(deltas=[RequestDelta("x", [1, 2], finished=True, finish_reason="stop")],
                        stats=EngineStats(1, 0, 7, 8, 60, 64))]


@pytest.mark.parametrize("message", MESSAGES, ids=[type(m).__name__ for m in MESSAGES])
def test_every_message_round_trips_through_its_encoding(message):
    assert decode_message(encode_message(message)) == message


@pytest.mark.parametrize("frame", [b"\xc1", msgspec.msgpack.encode([1]), msgspec.msgpack.encode({"type": "Nope"}),
                                   msgspec.msgpack.encode({"type": "AbortRequest"}),
                                   msgspec.msgpack.encode({"type": "Shutdown", "extra": 1}),
                                   msgspec.msgpack.encode({"type": "AbortRequest", "request_id": 7})],
                         ids=["not_msgpack", "not_object", "unknown_type", "missing_field", "unknown_field",
                              "wrong_type"])
def test_bad_frames_raise_value_error(frame):
    with pytest.raises(ValueError, match="decode_message"):
        decode_message(frame)


def test_every_accepted_request_is_acknowledged_by_the_next_step():
    """A request that must wait for a slot still gets a first (empty) delta from the next step, so the API server
    knows it was accepted and can answer (and notice a client that leaves) before its first token."""
    core = EngineCore(LLM(model="fd-toy", max_num_seqs=1).engine)
    core.handle(_add("runs", max_tokens=50, min_tokens=50))
    core.handle(_add("queued"))
    deltas = {d.request_id: d for d in core.step().deltas}
    assert deltas["queued"].new_token_ids == [] and not deltas["queued"].finished
    assert core.instance.num_waiting() == 1
    assert all(d.request_id != "queued" for d in core.step().deltas)


def test_mixed_instance_describes_itself_by_its_compatibility_hash():
    """SERVICES §5 with PD_MTP_FLOW §3: a mixed instance registers under the same compatibility hash a PD instance
    of that configuration would carry (not a placeholder), so instances with different K are told apart, and it
    reports no PD metrics."""
    plain, mtp = LLM(model="fd-toy").engine, LLM(model="fd-toy", speculative_config={"method": "mtp"}).engine
    assert plain.describe()["role"] == "mixed" and plain.pd_counters() is None
    assert plain.describe()["config_hash"] != mtp.describe()["config_hash"]
    assert EngineCore(plain).stats().pd is None
