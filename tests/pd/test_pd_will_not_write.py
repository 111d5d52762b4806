"""P says when it will not write (SERVICES §7): for a reservation whose request ends on P
before its hand-off starts, one that expires without its request, and a duplicate P drops after the transport
accepted it, P answers D with `refuse`, so D ends the request — or, over Mooncake, the quarantine of its blocks —
at once instead of at its own deadline. D's clock is a FakeClock wherever D's deadline could otherwise end the
wait, so only P's answer can."""
from __future__ import annotations

from dataclasses import replace

import pytest

from fastdeploy.entrypoints.pd_builder import build_engine, with_role
from fastdeploy.model_executor.models import get_model
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from fastdeploy.splitwise.zmq_transport import ZmqTransport
from tests.splitwise.fakes import FakeClock

from .harness import start_pd, toy_config
from .test_pd_zmq_faults import DEADLINES, Pair

MODEL = get_model("fd-toy")
PROMPT = MODEL.find_prompt(6, 9, seed=5)


class FrozenPair(Pair):
    """A Pair whose D runs on its own FakeClock (never advanced): D's deadlines cannot end anything."""

    def __init__(self, protocol: str = "zmq"):
        super().__init__()
        self.decode.close()
        self.d_transport = ZmqTransport()
        config = toy_config(1)
        if protocol != "zmq":
            config = replace(config, cache=replace(config.cache, transfer_protocol=protocol))
            self.prefill.close()
            self.p_transport = ZmqTransport(listen="127.0.0.1:0")
            self.prefill = build_engine(with_role(config, "prefill"), MODEL, self.p_transport, clock=self.clock,
                                        deadlines=DEADLINES, idle_poll_s=0.0)
        self.decode = build_engine(with_role(config, "decode"), MODEL, self.d_transport, clock=FakeClock(),
                                   deadlines=DEADLINES)

    def reserve_at_p_only(self, rid: str):
        request = self.add(rid, PROMPT, prefill=False, max_tokens=4)
        self.step_until(lambda: rid in self.prefill.connector._reserved)
        return request

    def close(self):
        self.prefill.close()
        self.decode.close()


@pytest.fixture
def pair():
    made = []

    def make(protocol: str = "zmq") -> FrozenPair:
        made.append(FrozenPair(protocol))
        return made[-1]

    yield make
    for item in made:
        item.close()


def test_a_request_that_ends_on_p_before_its_handoff_ends_on_d_at_once(pair):
    pd = pair()
    request = pd.reserve_at_p_only("r0")
    pd.prefill.add_request("r0", PROMPT, SamplingParams(max_tokens=4),
                           disaggregate_info={"request_id": "r0", "prefill_addr": pd.p_transport.address})
    assert pd.prefill.abort("r0", "the client went away")
    pd.step_until(lambda: not pd.decode.has_unfinished())
    assert request.finish_reason == "abort" and "P will not write: the request ended on P" in request.error


def test_a_reservation_that_expires_on_p_ends_on_d_at_once(pair):
    pd = pair()
    request = pd.reserve_at_p_only("r0")
    pd.clock.advance(DEADLINES.reservation_s + 1)   # P's clock: its request never came
    pd.step_until(lambda: not pd.decode.has_unfinished())
    assert request.finish_reason == "abort" and "did not come to P within the reservation deadline" in request.error


def test_ps_refusal_ends_ds_mooncake_quarantine_at_once(pair):
    reason = mooncake_unavailable_reason()
    if reason is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    pd = pair("mooncake-tcp")
    pd.reserve_at_p_only("r0")
    assert pd.decode.abort("r0")   # D gives up while P could still write: its blocks are quarantined
    assert pd.decode.resources.num_held_blocks > 0
    pd.clock.advance(DEADLINES.reservation_s + 1)   # P drops the reservation and says so
    pd.step_until(lambda: pd.decode.resources.num_held_blocks == 0 and not pd.decode.has_unfinished())
    assert pd.decode.connector.describe_held() == ""


def test_a_duplicate_reservation_p_drops_is_refused_to_its_d(monkeypatch):
    """The connector's own duplicate check (the transport has no route for the id, as in-process, or once the
    first one's route ended): P answers `refuse`, so that D does not wait for a hand-off that never comes."""
    pd = start_pd(1)
    prefill = pd.engine.prefill
    refused = []
    monkeypatch.setattr(pd.engine.transport, "refuse", lambda rid, why: refused.append((rid, why)), raising=False)
    prefill.add_request("r0", PROMPT, SamplingParams(max_tokens=4),
                        disaggregate_info={"request_id": "r0", "prefill_addr": None})
    pd.engine.transport.reserve("r0")
    pd.engine.transport.reserve("r0")   # the second reservation of a live request
    prefill.step()
    assert refused == [("r0", "duplicate")]
