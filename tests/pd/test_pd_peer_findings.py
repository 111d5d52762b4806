"""What a peer, or a client pairing by hand, can do to a PD instance at engine level (docs/design.md §8, SERVICES
§6-§7): each case fails the one request it concerns, with an error naming why, and leaves both instances free and
serving; none escapes `step`. P and D are LLMEngines in this process over ZeroMQ on loopback (or, for the Mooncake
quarantine, over mooncake-tcp)."""
from __future__ import annotations

import dataclasses
import errno
import time
from dataclasses import replace

import numpy as np
import pytest
import zmq

from fastdeploy.engine.connector import prefill as prefill_connector
from fastdeploy.entrypoints.pd_builder import build_engine, with_role
from fastdeploy.model_executor.models import get_model
from fastdeploy.schema.request import RequestIdInUseError
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise import (Deadline, HandoffDeadlines, HandoffSamplingParams, InProcessTransport,
                                  MonotonicClock, WaitKind)
from fastdeploy.splitwise.kv_stream import Landing
from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from fastdeploy.splitwise.transport import Envelope
from fastdeploy.splitwise.zmq_transport import ZmqTransport
from tests.services import launcher
from tests.splitwise.fakes import FakeClock, reservation_ids

from .harness import toy_config
from .test_pd_zmq_faults import BOUND_STEPS, DEADLINES, Pair, assert_free, step_until_reserved

MODEL = get_model("fd-toy")
PROMPT_A = MODEL.find_prompt(6, 9, seed=5)
PROMPT_B = MODEL.find_prompt(6, 14, seed=6)


def info(rid: str, prefill_addr: str) -> dict:
    return {"request_id": rid, "prefill_addr": prefill_addr}


def settle(pair: Pair) -> None:
    pair.step_until(lambda: not pair.decode.has_unfinished() and not pair.prefill.has_unfinished())


# ---- finding 2: an address libzmq refuses, a transport error while telling P ----

@pytest.mark.parametrize("address", ["-:5000", "_x:5000", ".a.:5000", "a..b:5000", "a:99999", "::1:5000",
                                     "[::1:5000", "a b:5000", "a;b:5000", "1.2.3.999:80", "[::1%a b]:5000",
                                     "[::1%$x]:5000", "[::1%]:5000"])
def test_an_address_libzmq_cannot_use_is_refused_at_admission(address):
    """docs/design.md §8: the address rule (schema/pairing.py) refuses at admission, naming the field, what libzmq
    would refuse inside `schedule()`; nothing is held and D keeps stepping."""
    pair = Pair()
    try:
        with pytest.raises(ValueError, match="prefill_addr"):
            pair.decode.add_request("r0", PROMPT_A, SamplingParams(max_tokens=4),
                                    disaggregate_info=info("r0", address))
        pair.decode.step()
        assert_free(pair.decode)
    finally:
        pair.close()


def test_a_transport_error_telling_p_fails_that_request_only(monkeypatch):
    """docs/design.md §8 (DecodeConnector.on_allocated): an error of the transport other than a full queue fails
    the request whose reservation it was, naming it; the next request is served."""
    pair = Pair()
    try:
        reserve = pair.d_transport.reserve

        def broken(rid, *args, **kwargs):
            if rid == "r0":
                raise zmq.ZMQError(errno.EMFILE, "Too many open files")
            return reserve(rid, *args, **kwargs)

        monkeypatch.setattr(pair.d_transport, "reserve", broken)
        failed = pair.decode.add_request("r0", PROMPT_A, SamplingParams(max_tokens=4),
                                         disaggregate_info=info("r0", pair.p_transport.address))
        pair.step_until(lambda: failed.finish_reason is not None)
        assert failed.finish_reason == "abort" and "could not be told" in failed.error
        served = pair.add("r1", PROMPT_A, max_tokens=4)
        settle(pair)
        assert served.finish_reason in ("stop", "length") and served.output_token_ids
        assert_free(pair.decode)
        assert_free(pair.prefill)
    finally:
        pair.close()


# ---- finding 3: a repeated reservation on P ----

def _prefill_alone():
    transport = InProcessTransport()
    prefill = build_engine(with_role(toy_config(1), "prefill"), MODEL, transport, clock=FakeClock(),
                           deadlines=DEADLINES, idle_poll_s=0.0)
    return transport, prefill


@pytest.mark.parametrize("max_tokens", [1, 16], ids=["t0-ends-it", "kv-held"])
def test_a_repeated_reservation_while_the_ack_is_awaited_is_refused(max_tokens):
    """docs/design.md §8: a second reservation of an id whose hand-off awaits D's ack neither crashes P nor
    reroutes; a request reusing the id meanwhile is refused as in use (409); P, idle, still reads the ack and
    ends holding nothing, also when t0 ended the request (no blocks held, only the wait)."""
    transport, prefill = _prefill_alone()
    transport.reserve("r0")
    prefill.add_request("r0", PROMPT_A, SamplingParams(max_tokens=max_tokens), disaggregate_info={"request_id": "r0"})
    for _ in range(BOUND_STEPS):
        if prefill.step():
            break
    assert transport.poll() is not None, "P sent its hand-off"
    transport.reserve("r0")
    prefill.step()
    with pytest.raises(RequestIdInUseError, match="already in use"):
        prefill.add_request("r0", PROMPT_A, SamplingParams(max_tokens=4), disaggregate_info={"request_id": "r0"})
    assert prefill.has_unfinished(), "P still awaits D's ack: its core must keep stepping to read it"
    transport.ack("r0")
    for _ in range(3):
        prefill.step()
    assert_free(prefill)


# ---- finding 4: a hand-off made for another request ----

@pytest.mark.parametrize("d_prompt,d_params,named", [
    (PROMPT_B, {}, "prompt has 9 tokens, D's request has 14"),          # short hand-off, longer D request
    (PROMPT_A[:-1] + [PROMPT_A[-1] ^ 1], {}, "prompt differs from D's at token 8"),
    (PROMPT_A, {"max_tokens": 12}, "'max_tokens' differs"),
    (PROMPT_A, {"min_tokens": 2}, "'min_tokens' differs"),
    (PROMPT_A, {"temperature": 0.5, "seed": 3}, "'temperature' differs"),
    (PROMPT_A, {"stop_token_ids": [7]}, "'eos_token_ids' differs"),
    (PROMPT_A, {"logprobs": 2}, "'logprobs' differs"),
    (PROMPT_A, {"top_p": 0.5}, "'top_p' differs (P: 1.0, D: 0.5)"),
], ids=["longer-prompt", "other-token", "max-tokens", "min-tokens", "temperature", "stop-ids", "logprobs", "top-p"])
def test_a_handoff_for_another_request_fails_d_naming_the_mismatch(d_prompt, d_params, named):
    """docs/design.md §8: P and D given different bodies under one id. D refuses P's hand-off before a single
    decode round (so no position past P's prompt is ever read from D's blocks), the error names what differs,
    and both free everything."""
    pair = Pair()
    try:
        address = pair.p_transport.address
        pair.prefill.add_request("r0", PROMPT_A, SamplingParams(max_tokens=8), disaggregate_info=info("r0", address))
        request = pair.decode.add_request("r0", d_prompt, SamplingParams(**{"max_tokens": 8, **d_params}),
                                          disaggregate_info=info("r0", address))
        settle(pair)
        assert request.finish_reason == "abort" and "made for another request" in request.error, request.error
        assert named in request.error, request.error
        assert request.output_token_ids == [] and request.metrics.num_decode_rounds == 0
        assert pair.decode.pd_counters()["refused"]["mismatch"] == 1
        assert_free(pair.decode)
        assert_free(pair.prefill)
    finally:
        pair.close()


def test_d_without_a_seed_continues_with_ps_seed():
    """docs/design.md §8: a client that set no seed leaves P to draw one; D, whose request has none either, takes
    P's (sampled PD output then equals P's own continuation); a D request with a seed must equal P's."""
    pair = Pair()
    try:
        address = pair.p_transport.address
        params = SamplingParams(max_tokens=8, temperature=0.8)
        on_p = pair.prefill.add_request("r0", PROMPT_A, params, disaggregate_info=info("r0", address))
        request = pair.decode.add_request("r0", PROMPT_A, params, disaggregate_info=info("r0", address))
        settle(pair)
        assert request.finish_reason in ("stop", "length"), request.error
        assert request.seed == on_p.seed and request.params.seed is None
        on_p = pair.prefill.add_request("r1", PROMPT_A, replace(params, seed=11), disaggregate_info=info("r1", address))
        other = pair.decode.add_request("r1", PROMPT_A, replace(params, seed=12), disaggregate_info=info("r1", address))
        settle(pair)
        assert other.finish_reason == "abort" and "'seed' differs (P: 11, D: 12)" in other.error, other.error
        assert_free(pair.decode)
    finally:
        pair.close()


# ---- finding 6: a hand-off with values SamplingParams refuses ----

def _forged_sampling(sampling: HandoffSamplingParams, seed: int) -> HandoffSamplingParams:
    """`sampling` with `seed`, bypassing HandoffSamplingParams' checks."""
    forged = object.__new__(HandoffSamplingParams)
    for field in dataclasses.fields(HandoffSamplingParams):
        object.__setattr__(forged, field.name, getattr(sampling, field.name))
    object.__setattr__(forged, "seed", seed)
    return forged


class _ForgedSeed:
    """P's connector building its hand-off's sampling values with a seed HandoffSamplingParams refuses (the
    streamed hand-off is sealed while it is sent, so the forgery is made where P builds it)."""

    @staticmethod
    def of_request(request, seed):
        return _forged_sampling(HandoffSamplingParams.of_request(request, seed), -5)


def test_a_handoff_with_sampling_values_samplingparams_refuses_fails_cleanly(monkeypatch):
    """docs/design.md §8: a hand-off whose seed SamplingParams refuses (negative) is refused at receipt; the
    request fails with an error, its slot and blocks come back (never orphaned)."""
    pair = Pair()
    try:
        monkeypatch.setattr(prefill_connector, "HandoffSamplingParams", _ForgedSeed)
        request = pair.add("r0", PROMPT_A, max_tokens=8)
        settle(pair)
        assert request.finish_reason == "abort" and "seed" in request.error, request.error
        assert_free(pair.decode)
        assert_free(pair.prefill)
    finally:
        pair.close()


def test_handoff_sampling_values_obey_samplingparams_rules():
    """docs/design.md §8: one set of rules for a request's sampling values and a hand-off's."""
    for bad in ({"min_tokens": 5}, {"top_p": 1.5}, {"top_p": 0.0}, {"temperature": -1.0}, {"seed": -1},
                {"logprobs": 21}):
        with pytest.raises(ValueError, match="HandoffSamplingParams: field"):
            HandoffSamplingParams(max_tokens=4, **bad)


# ---- finding 7: two messages for one id in one drain ----

def test_two_answers_for_one_id_in_one_drain_do_not_stop_d(monkeypatch):
    """docs/design.md §8: the transport delivers a hand-off twice in one drain; D takes the first, drops the
    second, acknowledges without error, and frees everything."""
    pair = Pair()
    try:
        poll, seen = pair.d_transport.poll, []

        def twice(deadline=None):
            if seen and seen[-1] is not None:
                envelope, seen[-1] = seen[-1], None
                return Envelope(envelope.request_id, envelope.payload)
            envelope = poll(deadline)
            if envelope is not None and not seen:
                seen.append(envelope)
            return envelope

        monkeypatch.setattr(pair.d_transport, "poll", twice)
        request = pair.add("r0", PROMPT_A, max_tokens=8)
        settle(pair)
        assert request.finish_reason in ("stop", "length"), request.error
        assert seen == [None], "the hand-off was delivered twice"
        assert_free(pair.decode)
        assert_free(pair.prefill)
    finally:
        pair.close()


# ---- finding 9: one vanished D ----

def test_a_vanished_d_delays_no_other_handoff():
    """docs/design.md §8: the D that reserved r0 disconnects before its hand-off; r1's hand-off, for another D,
    is sent at once (not after r0's KV_TRANSFER deadline), and P gives r0's blocks back."""
    p_transport = ZmqTransport(listen="127.0.0.1:0")
    clock = FakeClock()
    prefill = build_engine(with_role(toy_config(1), "prefill"), MODEL, p_transport, clock=clock,
                           deadlines=DEADLINES, idle_poll_s=0.0)
    gone, alive = ZmqTransport(), ZmqTransport()
    try:
        specs = prefill.connector.kv.placed_kv(len(PROMPT_A))   # D registers where r1's KV lands, as D does
        blocks = np.zeros(sum(spec.nbytes for spec in specs.target + specs.mtp), np.uint8)
        alive.expect_kv("r1", Landing([memoryview(blocks)]))
        for rid, d in (("r0", gone), ("r1", alive)):
            d.reserve(rid, p_transport.address)
        for _ in range(BOUND_STEPS):   # P sees both reservations before the requests come (idle: waits for them)
            prefill.step(max_wait_s=0.005)
            if "r0" in prefill.connector.describe_held() and "r1" in prefill.connector.describe_held():
                break
        gone.close()
        # setup, not an assertion: libzmq on P's side notices the closed connection (longer on a loaded machine)
        time.sleep(0.5 * launcher.load_slowdown())
        for rid in ("r0", "r1"):
            prefill.add_request(rid, PROMPT_A, SamplingParams(max_tokens=8), disaggregate_info={"request_id": rid})
        received = None
        for _ in range(BOUND_STEPS):
            prefill.step()
            received = alive.poll(Deadline.after(MonotonicClock(), 0.01))   # bounded: never a timing assertion
            if received is not None:
                break
        assert received is not None and received.request_id == "r1" and received.error is None
        alive.ack("r1")
        for _ in range(BOUND_STEPS):   # the ack and the streams' release come from the transports' threads
            prefill.step(max_wait_s=0.005)
            if not prefill.has_unfinished():
                break
            time.sleep(0.001)   # bounded in time, not only in steps: an idle P need not wait in its step
        assert_free(prefill)
        assert prefill.pd_counters()["send_failed"] == 1
    finally:
        alive.close()
        p_transport.close()


# ---- findings 5 and 8: D's Mooncake quarantine ----

@pytest.fixture
def mooncake_pair():
    reason = mooncake_unavailable_reason()
    if reason is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    config = toy_config(1)
    config = replace(config, cache=replace(config.cache, transfer_protocol="mooncake-tcp"))
    p_transport, d_transport = ZmqTransport(listen="127.0.0.1:0"), ZmqTransport()
    decode = build_engine(with_role(config, "decode"), MODEL, d_transport, deadlines=DEADLINES)
    yield p_transport, d_transport, decode
    decode.close()
    p_transport.close()


def test_an_id_in_quarantine_is_in_use_and_an_idle_quarantine_waits(mooncake_pair, monkeypatch):
    """docs/design.md §8: D gave up on r0 while P may still write into its blocks (quarantine). A request
    reusing r0 is refused as in use (409) instead of overwriting the quarantine and leaking its blocks; and D,
    holding nothing but the quarantine, waits for P's answer at each idle step (a bounded wait, never a spin)."""
    p_transport, d_transport, decode = mooncake_pair
    request = decode.add_request("r0", PROMPT_A, SamplingParams(max_tokens=4),
                                 disaggregate_info=info("r0", p_transport.address))
    step_until_reserved(decode, request)
    assert reservation_ids(p_transport)(Deadline.after(MonotonicClock(), 10.0)) == "r0"   # P never answers it
    assert decode.abort("r0")
    assert request.finish_reason == "abort" and decode.has_unfinished()
    with pytest.raises(RequestIdInUseError, match="already in use"):
        decode.add_request("r0", PROMPT_A, SamplingParams(max_tokens=4),
                           disaggregate_info=info("r0", p_transport.address))
    deadlines = []
    poll = d_transport.poll
    monkeypatch.setattr(d_transport, "poll", lambda deadline=None: deadlines.append(deadline) or poll(deadline))
    decode.step()
    assert any(d is not None for d in deadlines), "an idle step holding a quarantine must wait for P"


def test_no_block_of_a_quarantine_is_free_while_it_is_recorded(mooncake_pair):
    """A defect the suite once missed: while D records a quarantine for r0, every block it had
    reserved for r0 stays out of the free pool (P may still write into them: another request given one would
    receive P's late bytes), and a request admitted meanwhile gets none of them."""
    p_transport, d_transport, decode = mooncake_pair
    request = decode.add_request("r0", PROMPT_A, SamplingParams(max_tokens=4),
                                 disaggregate_info=info("r0", p_transport.address))
    step_until_reserved(decode, request)
    assert p_transport.poll_reservation_with_data(Deadline.after(MonotonicClock(), 10.0)).request_id == "r0"
    reserved = list(request.block_ids)
    assert reserved
    assert decode.abort("r0")
    assert decode.connector.has_state("r0"), "D must record the quarantine of r0"
    stats = decode.stats()
    assert stats.total_kv_blocks - stats.free_kv_blocks == len(reserved), stats
    decode.add_request("r1", PROMPT_B, SamplingParams(max_tokens=4),
                       disaggregate_info=info("r1", p_transport.address))
    decode.step()
    taken = [rid for rid, r in decode.scheduler.peer_waiting.items() if set(r.block_ids) & set(reserved)]
    assert taken == [], f"a block of r0's quarantine went to {taken}"


def test_ps_one_sided_write_may_take_only_what_is_left_of_ds_deadline(monkeypatch):
    """docs/design.md §8 (Mooncake): P writes into D's blocks only within PREFILL_RESULT of the reservation, and
    the write itself is bounded by what is left of it, so it cannot land after D gave up on those blocks."""
    reason = mooncake_unavailable_reason()
    if reason is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    config = toy_config(1)
    config = replace(config, cache=replace(config.cache, transfer_protocol="mooncake-tcp"))
    p_transport, d_transport, clock = ZmqTransport(listen="127.0.0.1:0"), ZmqTransport(), FakeClock()
    prefill = build_engine(with_role(config, "prefill"), MODEL, p_transport, clock=clock, deadlines=DEADLINES,
                           idle_poll_s=0.0)
    decode = build_engine(with_role(config, "decode"), MODEL, d_transport, deadlines=DEADLINES)
    try:
        write_to, timeouts = prefill.connector.kv_transfer.write_to, []

        def recording(*args, **kwargs):
            timeouts.append(kwargs.get("timeout_s"))
            return write_to(*args, **kwargs)

        monkeypatch.setattr(prefill.connector.kv_transfer, "write_to", recording)
        request = decode.add_request("r0", PROMPT_A, SamplingParams(max_tokens=8),
                                     disaggregate_info=info("r0", p_transport.address))
        for _ in range(BOUND_STEPS):
            decode.step(max_wait_s=0.005)
            prefill.step()
            if "reservations without a request" in prefill.connector.describe_held():
                break
        clock.advance(2.0)
        prefill.add_request("r0", PROMPT_A, SamplingParams(max_tokens=8), disaggregate_info={"request_id": "r0"})
        for _ in range(BOUND_STEPS):
            prefill.step()
            decode.step(max_wait_s=0.005)
            if request.finish_reason is not None:
                break
        assert request.finish_reason in ("stop", "length"), request.error
        nbytes = prefill.connector.handoff_kv_bytes(len(PROMPT_A))   # D's deadline is scaled by the KV's bytes
        assert timeouts == [pytest.approx(DEADLINES.timeout_s(WaitKind.PREFILL_RESULT, nbytes) - 2.0)]
        assert timeouts[0] > DEADLINES.prefill_result_s - 2.0
    finally:
        prefill.close()
        decode.close()


def test_a_reservation_no_p_acknowledges_fails_at_its_short_deadline():
    """docs/design.md §8: P acknowledges a reservation as soon as it reads it; a request paired with an address
    no P serves fails at the (short) acknowledgement deadline, naming the address, instead of holding D's slot
    and blocks for the prefill result's deadline (it holds none: nothing completed a connection there)."""
    d_transport = ZmqTransport()
    decode = build_engine(with_role(toy_config(1), "decode"), MODEL, d_transport,
                          deadlines=HandoffDeadlines(reservation_ack_s=0.3))
    try:
        request = decode.add_request("r0", PROMPT_A, SamplingParams(max_tokens=4),
                                     disaggregate_info=info("r0", "127.0.0.1:1"))
        for _ in range(BOUND_STEPS):   # each idle step waits at most 10 ms for P
            decode.step(max_wait_s=0.01)
            if request.finish_reason is not None:
                break
        assert request.finish_reason == "abort", request.error
        assert "no prefill instance completed a connection at 127.0.0.1:1 within 0.3 s" in request.error
        assert_free(decode)
    finally:
        decode.close()
