"""A P that completes the connection but never answers (SERVICES §6, docs/design.md §8 "A P that never answers
holds no slot"): with or without a PD secret (the fake P holds it, so it passes D's authentication), D sends it one
reservation (the probe) and holds one slot for it; every later request for it waits without a slot while another
P's requests are served in D's other slot; when the probe's acknowledgement deadline passes, the probe and every
request waiting behind it fail at once, naming the address, and D holds nothing. A P that acknowledged but sends no
hand-off is bounded by the prefill-result deadline. D's clock is a FakeClock: only `advance` ends a deadline."""
from __future__ import annotations

import pytest

from fastdeploy.entrypoints.pd_builder import build_engine, with_role
from fastdeploy.model_executor.models import get_model
from fastdeploy.schema.request import RequestStatus
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise import HandoffDeadlines, WaitKind
from fastdeploy.splitwise.zmq_transport import ZmqTransport
from tests.splitwise.fakes import FakeClock

from .harness import toy_config
from .silent_p import SilentP
from .test_pd_zmq_faults import BOUND_STEPS, Pair, assert_free, step_until_reserved

MODEL = get_model("fd-toy")
DEADLINES = HandoffDeadlines(decode_allocation_s=60.0, kv_transfer_s=5.0, prefill_result_s=5.0, reservation_s=5.0,
                             reservation_ack_s=5.0)
PROMPT = MODEL.find_prompt(6, 9, seed=5)
SECRET = b"s" * 32


def _pair(secret: bytes | None) -> tuple[Pair, FakeClock]:
    """A live P and a D with two slots on a FakeClock, both holding `secret`."""
    pair = Pair(p_secret=secret, d_secret=secret)
    pair.decode.close()
    pair.d_transport = ZmqTransport(secret=secret)
    clock = FakeClock()
    pair.decode = build_engine(with_role(toy_config(1, max_num_seqs=2), "decode"), MODEL, pair.d_transport,
                               clock=clock, deadlines=DEADLINES)
    return pair, clock


def _for(pair: Pair, silent: SilentP, n: int) -> list:
    return [pair.decode.add_request(f"mute-{i}", PROMPT, SamplingParams(max_tokens=4),
                                    disaggregate_info={"request_id": f"mute-{i}", "prefill_addr": silent.address})
            for i in range(n)]


@pytest.mark.parametrize("secret", [None, SECRET], ids=["unkeyed", "keyed"])
def test_a_connected_p_that_never_answers_holds_one_slot_until_its_deadline(secret):
    pair, clock = _pair(secret)
    silent = SilentP(secret)
    try:
        muted = _for(pair, silent, 16)
        step_until_reserved(pair.decode, muted[0])
        good = pair.add("good", PROMPT, max_tokens=4)
        pair.step_until(lambda: good.status is RequestStatus.FINISHED)
        assert good.finish_reason == "length" and good.error is None
        assert [r.status for r in muted] == [RequestStatus.WAITING_FOR_PEER] + [RequestStatus.WAITING] * 15, \
            "a P that never answered was given more than one slot"
        clock.advance(DEADLINES.reservation_ack_s)
        pair.decode.step(max_wait_s=0.0)
        assert all(r.status is RequestStatus.FINISHED and r.finish_reason == "abort" for r in muted)
        assert "reservation acknowledgement did not complete" in muted[0].error, muted[0].error
        assert all(f"the prefill instance at {silent.address} completed a connection but acknowledged no "
                   "reservation within 5 s" in r.error for r in muted[1:]), muted[1].error
        assert_free(pair.decode)
        again = _for(pair, silent, 1)[0]   # the id mute-0 is free again: a later request probes the P anew
        step_until_reserved(pair.decode, again)
        assert silent.accept_next() == "mute-0"
    finally:
        silent.close()
        pair.close()


def test_a_p_that_acknowledged_but_sends_no_hand_off_frees_d_at_the_prefill_result_deadline():
    pair, clock = _pair(None)
    silent = SilentP()
    try:
        muted = _for(pair, silent, 2)
        step_until_reserved(pair.decode, muted[0])
        assert silent.accept_next() == "mute-0"   # P answered: D takes slots for its requests
        step_until_reserved(pair.decode, muted[1])
        assert silent.accept_next() == "mute-1"
        waits = pair.decode.connector.waits
        for _ in range(BOUND_STEPS):   # D takes the acknowledgements in: now the hand-offs are awaited
            if waits.ids_of(WaitKind.PREFILL_RESULT) == ["mute-0", "mute-1"]:
                break
            pair.decode.step(max_wait_s=0.005)
        assert waits.ids_of(WaitKind.PREFILL_RESULT) == ["mute-0", "mute-1"]
        assert [r.status for r in muted] == [RequestStatus.WAITING_FOR_PEER] * 2
        clock.advance(DEADLINES.timeout_s(WaitKind.PREFILL_RESULT, 1 << 30))   # past any scaled deadline
        pair.decode.step(max_wait_s=0.0)
        assert all(r.status is RequestStatus.FINISHED and "prefill result did not complete" in r.error
                   for r in muted), [r.error for r in muted]
        assert_free(pair.decode)
    finally:
        silent.close()
        pair.close()
