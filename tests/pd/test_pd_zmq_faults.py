"""The failure table of SERVICES §6 at engine level, over the ZeroMQ connector (no HTTP): each fault ends the
request with an error naming its cause within its deadline, and the instances free what they hold (I10, O3).
P and D run in this process on separate connectors joined by loopback TCP; P's deadlines run on a FakeClock."""
from __future__ import annotations

import time

from fastdeploy.schema.request import RequestStatus
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.entrypoints.pd_builder import build_engine, with_role
from fastdeploy.model_executor.models import get_model
from fastdeploy.splitwise import HandoffDeadlines
from tests.splitwise.fakes import FakeClock
from fastdeploy.splitwise.zmq_transport import ZmqTransport

from .harness import toy_config
from .test_pd_scenarios import MODEL

BOUND_STEPS = 2000    # turns a hang into a failure; never an assertion on time
DEADLINES = HandoffDeadlines(decode_allocation_s=5.0, kv_transfer_s=5.0, prefill_result_s=5.0, reservation_s=5.0)


class Pair:
    def __init__(self, p_k: int = 1, d_k: int = 1, d_deadlines: HandoffDeadlines | None = None,
                 p_secret: bytes | None = None, d_secret: bytes | None = None):
        self.p_transport = ZmqTransport(listen="127.0.0.1:0", secret=p_secret)
        self.d_transport = ZmqTransport(secret=d_secret)
        self.clock = FakeClock()
        model = get_model("fd-toy")
        self.prefill = build_engine(with_role(toy_config(p_k), "prefill"), model, self.p_transport, clock=self.clock,
                                              deadlines=DEADLINES, idle_poll_s=0.0)
        self.decode = build_engine(with_role(toy_config(d_k), "decode"), model, self.d_transport,
                                   deadlines=d_deadlines)

    def add(self, rid: str, prompt: list[int], prefill: bool = True, **params):
        info = {"request_id": rid, "prefill_addr": self.p_transport.address}
        if prefill:
            self.prefill.add_request(rid, prompt, SamplingParams(**params), disaggregate_info=info)
        return self.decode.add_request(rid, prompt, SamplingParams(**params), disaggregate_info=info)

    def step_until(self, done) -> list:
        reported = []
        for _ in range(BOUND_STEPS):
            reported += self.prefill.step()
            self.decode.step(max_wait_s=0.005)
            if done():
                return reported
        raise AssertionError("the condition was not reached within the step bound")

    def close(self):
        self.p_transport.close()
        self.d_transport.close()


def step_until_reserved(decode, request) -> None:
    """Step D until it has told P of `request` (it reserves only once its connection to P completed its
    handshake, a few steps after the first); bounded in steps and, through each step's wait, in time."""
    for _ in range(BOUND_STEPS):
        decode.step(max_wait_s=0.005)
        if request.status is RequestStatus.WAITING_FOR_PEER:
            return
    raise AssertionError(f"D did not reserve {request.request_id} within the step bound")


def assert_free(instance) -> None:
    stats = instance.stats()
    assert (stats.free_slots, stats.free_kv_blocks) == (stats.total_slots, stats.total_kv_blocks), stats
    assert not instance.has_unfinished()


def test_configuration_mismatch_is_refused_at_receipt_and_both_sides_free():
    """SERVICES §6 row "config hash differs": D (K = 2) refuses P's (K = 1) hand-off naming the configuration hash; P's
    blocks come back at D's ack, D's reservation at the refusal."""
    pair = Pair(p_k=1, d_k=2)
    try:
        request = pair.add("r0", MODEL.find_prompt(6, 9, seed=5), max_tokens=16)
        pair.step_until(lambda: not pair.decode.has_unfinished() and not pair.prefill.has_unfinished())
        assert request.finish_reason == "abort" and "configuration hash" in request.error
        assert_free(pair.prefill)
        assert_free(pair.decode)
        sent, received = pair.prefill.pd_counters(), pair.decode.pd_counters()     # SERVICES §4 PD metrics
        assert (sent["handoffs_sent"], sent["held_blocks"], received["handoffs_received"]) == (1, 0, 1)
        assert sent["kv_bytes_sent"] > 0 and received["kv_bytes_received"] == 0
        assert received["refused"]["integrity"] == 1 and len(received["handoff_latency_s"]) == 1
    finally:
        pair.close()


def test_d_gone_before_its_ack_p_ends_the_wait_at_its_deadline():
    """SERVICES §6 row "D dies mid-request": P's blocks come back once the streamed hand-off has been read out of
    them (long before any deadline: the clock does not move); with no ack ever coming, its KV_TRANSFER wait ends at the deadline and P keeps
    serving."""
    pair = Pair()
    try:
        request = pair.add("r0", MODEL.find_prompt(6, 9, seed=5), max_tokens=16)
        step_until_reserved(pair.decode, request)   # D reserves and tells P, then never steps again
        reported = []
        for _ in range(BOUND_STEPS):        # D's reservation comes through both transports' threads
            reported += pair.prefill.step(max_wait_s=0.005)
            if reported:
                break
        assert [(r.request_id, r.finish_reason) for r in reported] == [("r0", "handed_off")]
        for _ in range(BOUND_STEPS):        # the stream is sent whole by the transport's thread
            pair.prefill.step(max_wait_s=0.005)
            if pair.prefill.stats().held_kv_blocks == 0:
                break
            time.sleep(0.001)   # bounded in time, not only in steps: an idle P need not wait in its step
        pair.d_transport.close()            # D is gone: the ack never comes
        pair.prefill.step()
        stats = pair.prefill.stats()
        assert stats.free_kv_blocks == stats.total_kv_blocks and stats.held_kv_blocks == 0
        assert pair.prefill.has_unfinished(), "P awaits D's ack until its deadline"
        pair.clock.advance(DEADLINES.kv_transfer_s)      # the deadline is scaled by the hand-off's bytes
        pair.prefill.step()
        assert pair.prefill.has_unfinished(), "P's wait lasts the KV's time at the floor rate on top"
        nbytes = pair.prefill.pd_counters()["kv_bytes_sent"]
        pair.clock.advance(DEADLINES.transfer_allowance_s(nbytes))
        pair.prefill.step()
        assert_free(pair.prefill)
    finally:
        pair.p_transport.close()


def test_p_without_the_request_lets_d_fail_it_at_its_deadline():
    """SERVICES §6 row "P refuses, fails or dies before the hand-off": P never gets the request, so its reservation
    waits unmatched; D fails the request at PREFILL_RESULT naming the wait and frees its reservation, and P drops the
    orphan reservation at its own deadline."""
    pair = Pair(d_deadlines=HandoffDeadlines(prefill_result_s=0.2))
    try:
        request = pair.add("r0", MODEL.find_prompt(6, 9, seed=5), prefill=False, max_tokens=16)
        pair.step_until(lambda: not pair.decode.has_unfinished())
        assert request.finish_reason == "abort"
        assert request.error.startswith("PD: request r0: prefill result did not complete within 0.2 s + "), \
            request.error
        assert_free(pair.decode)
        assert pair.prefill.has_unfinished(), "P holds the orphan reservation until its deadline"
        pair.clock.advance(DEADLINES.reservation_s)
        pair.prefill.step()
        assert_free(pair.prefill)
    finally:
        pair.close()


def test_p_request_without_a_reservation_fails_with_an_error_for_its_client():
    """SERVICES §6 step 3: P never computes a prompt no D holds blocks for; an unmatched request fails at the
    RESERVATION deadline with an error P's client sees, holding nothing."""
    pair = Pair()
    try:
        pair.prefill.add_request("lonely", MODEL.find_prompt(6, 9, seed=5), SamplingParams(max_tokens=8),
                                 disaggregate_info={"request_id": "lonely"})
        assert not pair.prefill.step() and pair.prefill.stats().free_kv_blocks == pair.prefill.stats().total_kv_blocks
        pair.clock.advance(DEADLINES.reservation_s)
        (failed,) = pair.prefill.step()
        assert failed.request_id == "lonely" and failed.finish_reason == "abort"
        assert failed.error == "PD: request lonely: reservation match did not complete within 5 s"
        assert_free(pair.prefill)
    finally:
        pair.close()


def test_wrong_secret_fails_the_request_at_its_connection_deadline_naming_the_secret():
    """SERVICES §7 with SERVICES §6: a D with another secret never completes a connection to P (peer_auth.py), so
    P receives nothing and computes nothing, and D fails the request at the reservation-ack deadline, naming the
    address and the secret, without having given it a slot. P's own copy of the request waits for a reservation
    that never comes and fails at its RESERVATION deadline."""
    pair = Pair(p_secret=b"one", d_secret=b"two", d_deadlines=HandoffDeadlines(reservation_ack_s=0.5))
    try:
        request = pair.add("r0", MODEL.find_prompt(6, 9, seed=5), max_tokens=16)
        pair.step_until(lambda: not pair.decode.has_unfinished())
        assert request.finish_reason == "abort" and "does it hold the same PD secret" in request.error
        assert pair.p_transport.address in request.error
        assert_free(pair.decode)
        assert sum(pair.prefill.pd_counters()["refused"].values()) == 0   # nothing was delivered
        assert pair.prefill.stats().free_kv_blocks == pair.prefill.stats().total_kv_blocks
        pair.clock.advance(DEADLINES.reservation_s)
        (failed,) = pair.prefill.step()
        assert failed.request_id == "r0" and "reservation match did not complete" in failed.error
        assert_free(pair.prefill)
    finally:
        pair.close()
