"""The streamed hand-off at engine level over the ZeroMQ connector (docs/design.md §8): P's step never waits for a
transfer (the transport's thread reads the KV out of the held blocks), a damaged piece fails its request at the
trailer, a stream that never ends fails at D's deadline; afterwards every block is back (check_invariant)."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from fastdeploy.entrypoints.pd_builder import build_engine, with_role
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise import HandoffDeadlines, WaitKind
from fastdeploy.splitwise.kv_stream import OutgoingStream
from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from fastdeploy.splitwise.peer_message import END
from fastdeploy.splitwise.zmq_transport import ZmqTransport
from fastdeploy.worker.kv_transfer import PromptKVPort

from tests.splitwise.fakes import FakeClock

from .harness import toy_config
from .test_pd_scenarios import MODEL
from .test_pd_zmq_faults import BOUND_STEPS, DEADLINES, Pair, assert_free

WAIT_S = 30.0     # turns a hang into a failure; never an assertion on time


def _drained(pair: Pair) -> bool:
    return not pair.decode.has_unfinished() and not pair.prefill.has_unfinished()


def _check_both(pair: Pair) -> None:
    for engine in (pair.prefill, pair.decode):
        engine.resources.check_invariant()
        assert_free(engine)


def _small_pieces(monkeypatch) -> list[int]:
    """Pieces of 16 bytes, so that even fd-toy's short prompts stream in several; returns the piece counts seen."""
    original, counts = OutgoingStream.next_piece, []

    def next_piece(self):
        self.piece_bytes = 16
        piece = original(self)
        if piece is None:
            counts.append(self.num_pieces)
        return piece

    monkeypatch.setattr(OutgoingStream, "next_piece", next_piece)
    return counts


def test_p_steps_while_its_hand_off_is_still_being_read_out_of_its_blocks(monkeypatch):
    entered, gate, left = threading.Event(), threading.Event(), threading.Event()
    counts = _small_pieces(monkeypatch)
    original = OutgoingStream.next_piece

    def held_piece(self):
        if not gate.is_set():
            entered.set()
            gate.wait(WAIT_S)
            left.set()
        return original(self)

    monkeypatch.setattr(OutgoingStream, "next_piece", held_piece)
    pair = Pair()
    try:
        prompt = MODEL.find_prompt(6, 9, seed=5)
        request = pair.add("r0", prompt, max_tokens=12)
        pair.step_until(lambda: entered.is_set())       # the transport's thread is inside the stream
        pair.prefill.step()                             # returns although the stream cannot move on
        assert not left.is_set(), "P's step waited for the transfer"
        assert pair.prefill.stats().held_kv_blocks > 0, "the blocks stay held while the stream reads them"
        pair.prefill.resources.check_invariant()
        gate.set()
        pair.step_until(lambda: _drained(pair))
        assert request.finish_reason in ("length", "stop") and request.error is None
        _check_both(pair)
        assert pair.prefill.pd_counters()["handoffs_sent"] == 1 and counts[0] >= 3, counts
    finally:
        gate.set()
        pair.close()


def test_a_damaged_piece_fails_the_request_at_the_trailer_and_frees_everything(monkeypatch):
    _small_pieces(monkeypatch)
    sized = OutgoingStream.next_piece

    def damaged(self):
        piece = sized(self)
        if piece is not None and self.num_pieces == 1:
            copy = bytearray(piece[0])
            copy[3] ^= 0x01             # after P hashed it: as if damaged on the way (P's block stays intact)
            piece[0] = memoryview(copy)
        return piece

    monkeypatch.setattr(OutgoingStream, "next_piece", damaged)
    pair = Pair(p_secret=b"s", d_secret=b"s")
    try:
        request = pair.add("r0", MODEL.find_prompt(6, 9, seed=5), max_tokens=12)
        pair.step_until(lambda: _drained(pair))
        assert request.finish_reason == "abort" and "integrity tag" in request.error
        assert pair.decode.pd_counters()["refused"]["integrity"] == 1
        _check_both(pair)
    finally:
        pair.close()


def test_a_stream_without_its_trailer_fails_at_d_deadline_with_nothing_leaked(monkeypatch):
    _small_pieces(monkeypatch)
    original = ZmqTransport._next_message

    def no_trailer(job):
        message = original(job)
        return None if message is not None and message[0] == END else message

    monkeypatch.setattr(ZmqTransport, "_next_message", staticmethod(no_trailer))
    pair = Pair(d_deadlines=HandoffDeadlines(prefill_result_s=0.5))
    try:
        prompt = MODEL.find_prompt(6, 9, seed=5)
        request = pair.add("r0", prompt, max_tokens=12)
        pair.step_until(lambda: request.finish_reason is not None)
        assert request.finish_reason == "abort" and "PREFILL_RESULT" in request.error.upper().replace(" ", "_")
        pair.step_until(lambda: not pair.decode.has_unfinished())
        pair.decode.resources.check_invariant()
        assert_free(pair.decode)
        assert not pair.d_transport._landings
        # P's wait for the ack that never comes, scaled by the hand-off's bytes
        nbytes = pair.prefill.connector.handoff_kv_bytes(len(prompt))
        pair.clock.advance(DEADLINES.timeout_s(WaitKind.KV_TRANSFER, nbytes))
        pair.step_until(lambda: not pair.prefill.has_unfinished())
        pair.prefill.resources.check_invariant()
        assert_free(pair.prefill)
    finally:
        pair.close()


def test_a_cache_outside_host_memory_streams_through_a_gathered_copy_and_a_staging_buffer(monkeypatch):
    """A device cache (no host view): P streams from one gathered copy, D lands the pieces in a staging buffer and
    writes it into its blocks at receipt; the tokens equal the host-memory path's."""
    outputs = []
    for in_host in (True, False):
        monkeypatch.setattr(PromptKVPort, "in_host_memory", property(lambda self, value=in_host: value))
        pair = Pair()
        try:
            request = pair.add("r0", MODEL.find_prompt(6, 9, seed=5), max_tokens=12)
            pair.step_until(lambda: _drained(pair))
            assert request.error is None and not pair.decode.connector._staged
            outputs.append(request.output_token_ids)
            _check_both(pair)
        finally:
            pair.close()
    assert outputs[0] == outputs[1] and len(outputs[0]) > 1


def test_p_steps_while_its_one_sided_write_is_still_running(monkeypatch):
    """Mooncake over the ZeroMQ connector: the write, its hash and its wait run on the placing thread; P's step
    returns while the write cannot proceed, the blocks stay held, and the request completes once it can."""
    reason = mooncake_unavailable_reason()
    if reason is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    config = toy_config(1)
    config = replace(config, cache=replace(config.cache, transfer_protocol="mooncake-tcp"))
    p_transport, d_transport, clock = ZmqTransport(listen="127.0.0.1:0"), ZmqTransport(), FakeClock()
    prefill = build_engine(with_role(config, "prefill"), MODEL, p_transport, clock=clock,
                           deadlines=DEADLINES, idle_poll_s=0.0)
    decode = build_engine(with_role(config, "decode"), MODEL, d_transport, deadlines=DEADLINES)
    entered, gate, left = threading.Event(), threading.Event(), threading.Event()
    write_to = prefill.connector.kv_transfer.write_to

    def held_write(*args, **kwargs):
        entered.set()
        gate.wait(WAIT_S)
        left.set()
        return write_to(*args, **kwargs)

    monkeypatch.setattr(prefill.connector.kv_transfer, "write_to", held_write)
    try:
        info = {"request_id": "r0", "prefill_addr": p_transport.address}
        prompt = MODEL.find_prompt(6, 9, seed=5)
        prefill.add_request("r0", prompt, SamplingParams(max_tokens=12), disaggregate_info=info)
        request = decode.add_request("r0", prompt, SamplingParams(max_tokens=12), disaggregate_info=info)
        for _ in range(BOUND_STEPS):
            prefill.step()
            decode.step(max_wait_s=0.005)
            if entered.is_set():
                break
        prefill.step()                                  # returns although the write cannot proceed
        assert not left.is_set(), "P's step waited for the one-sided write"
        assert prefill.stats().held_kv_blocks > 0
        gate.set()
        for _ in range(BOUND_STEPS):
            prefill.step()
            decode.step(max_wait_s=0.005)
            if not prefill.has_unfinished() and not decode.has_unfinished():
                break
        assert request.finish_reason in ("length", "stop") and request.error is None
        for engine in (prefill, decode):
            engine.resources.check_invariant()
            assert_free(engine)
    finally:
        gate.set()
        prefill.close()
        decode.close()
