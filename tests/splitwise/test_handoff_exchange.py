"""A P side and a D side driving the connector as the engine does (PD_MTP_FLOW §2, §4.4, §5.1–5.2, I10, O3).

The two stand-ins below hold NumPy caches and free-block lists only; they show the call sequence of docs/design.md
§4 and check ownership: every block and every wait is released on every path, faults included.
"""

from __future__ import annotations

import numpy as np

from fastdeploy.splitwise import (
    FinishAtReceipt,
    HandoffDeadlines,
    HandoffMessage,
    HandoffSamplingParams,
    Insert,
    PendingWaits,
    Reject,
    WaitKind,
    receive_handoff,
)
from tests.splitwise.fakes import FakeClock, Fault, FaultyTransport

from .handoff_factory import EOS, KV_LAYOUT, MTP_CONFIG_HASH, MTP_TAILS, TARGET_TAILS

BLOCK_SIZE, NUM_BLOCKS, K = 4, 16, 1
DEADLINES = HandoffDeadlines(decode_allocation_s=5.0, kv_transfer_s=20.0, prefill_result_s=10.0)


def _positions(block_ids, num_tokens):
    """Where positions 0..L-1 live in a paged layer [num_blocks, block_size, *tail] (docs/design.md §3)."""
    positions = np.arange(num_tokens)
    return np.asarray(block_ids)[positions // BLOCK_SIZE], positions % BLOCK_SIZE


def gather_prompt_kv(layer, block_ids, num_tokens):
    return layer[_positions(block_ids, num_tokens)]


def scatter_prompt_kv(kv, layer, block_ids):
    layer[_positions(block_ids, kv.shape[0])] = kv


class _Instance:
    def __init__(self, clock, seed):
        rng = np.random.default_rng(seed)
        self.layers = [rng.standard_normal((NUM_BLOCKS, BLOCK_SIZE, *t)).astype(np.float32)
                       for t in TARGET_TAILS + MTP_TAILS]
        self.free_blocks = list(range(NUM_BLOCKS))
        self.waits = PendingWaits(clock, DEADLINES)
        self.blocks: dict[str, list[int]] = {}

    def allocate(self, rid, num_tokens):
        count = -(-num_tokens // BLOCK_SIZE)
        self.blocks[rid], self.free_blocks = self.free_blocks[:count], self.free_blocks[count:]

    def free(self, rid):
        self.free_blocks.extend(self.blocks.pop(rid))


class _PrefillSide(_Instance):
    def hand_off(self, transport, rid, prompt, t0, d1):
        """PD_MTP_FLOW §4.4: after P's token processor read [t0, d1]: gather KV, seal, send, keep the blocks until the
        ack."""
        self.allocate(rid, len(prompt))
        kv = [gather_prompt_kv(layer, self.blocks[rid], len(prompt)) for layer in self.layers]
        message = HandoffMessage.create(
            request_id=rid, prompt_token_ids=prompt, sampling=HandoffSamplingParams(max_tokens=8, eos_token_ids=(EOS,)),
            t0=t0, draft_token_ids=(t0, d1), kv_target=kv[:len(TARGET_TAILS)], kv_mtp=kv[len(TARGET_TAILS):],
            config_hash=MTP_CONFIG_HASH)
        transport.send(rid, message.encode())
        self.waits.start(rid, WaitKind.KV_TRANSFER)
        return kv

    def step(self, transport):
        """Free the blocks of acknowledged hand-offs, and of those whose ack did not come in time."""
        while (rid := transport.poll_ack()) is not None:
            if self.waits.finish(rid) is not None:
                self.free(rid)
        for expired in self.waits.pop_expired():
            self.free(expired.request_id)


class _DecodeSide(_Instance):
    def __init__(self, clock, seed):
        super().__init__(clock, seed)
        self.inserted, self.finished, self.failed = {}, {}, {}

    def preallocate(self, rid, prompt_len):
        """PD_MTP_FLOW §5.1: blocks for positions 0..L+1 (prompt + t0, d1), then wait for P's result."""
        self.allocate(rid, prompt_len + 2)
        self.waits.start(rid, WaitKind.PREFILL_RESULT)

    def step(self, transport):
        while (envelope := transport.poll()) is not None:
            verdict = receive_handoff(envelope.request_id, envelope.payload, config_hash=MTP_CONFIG_HASH,
                                      num_speculative_tokens=K, kv_layout=KV_LAYOUT)
            owned = self.waits.finish(envelope.request_id) is not None
            if owned and isinstance(verdict, Insert):
                message = verdict.message
                for layer, kv in zip(self.layers, message.kv_target + message.kv_mtp):
                    scatter_prompt_kv(kv, layer, self.blocks[verdict.request_id])
                self.inserted[verdict.request_id] = message.draft_token_ids[:2]
            elif owned and isinstance(verdict, FinishAtReceipt):
                self.finished[verdict.request_id] = (verdict.token_ids, verdict.finish_reason)
                self.free(verdict.request_id)
            elif owned and isinstance(verdict, Reject):
                self.failed[verdict.request_id] = verdict.error
                self.free(verdict.request_id)
            transport.ack(envelope.request_id)  # P's data is no longer needed, whatever the verdict
        for expired in self.waits.pop_expired():
            self.failed[expired.request_id] = expired.error
            self.free(expired.request_id)


def _assert_drained(p_side, d_side, transport):
    """O3: no pending wait, no message in flight, every block back except those of inserted requests."""
    assert len(p_side.waits) == 0 and len(d_side.waits) == 0
    assert transport.num_in_flight() == 0 and transport.num_pending_acks() == 0
    assert sorted(p_side.free_blocks) == list(range(NUM_BLOCKS))
    assert set(d_side.blocks) == set(d_side.inserted)
    held = sum(len(b) for b in d_side.blocks.values())
    assert len(d_side.free_blocks) + held == NUM_BLOCKS


def test_every_verdict_path_releases_blocks_and_waits():
    """PD_MTP_FLOW §5.2 verdicts through the transport: insert (bit-exact KV), finish at receipt, draft-id failure."""
    clock = FakeClock()
    transport = FaultyTransport(clock=clock)
    p_side, d_side = _PrefillSide(clock, seed=1), _DecodeSide(clock, seed=2)
    prompts = {"ok": [3, 4, 5, 6, 7], "eos": [8, 9], "one-draft": [10, 11, 12]}
    for rid, prompt in prompts.items():
        d_side.preallocate(rid, len(prompt))
    transport.inject_fault(Fault.ONE_DRAFT_ID, request_id="one-draft")
    sent_kv = p_side.hand_off(transport, "ok", prompts["ok"], t0=20, d1=21)
    p_side.hand_off(transport, "eos", prompts["eos"], t0=EOS, d1=21)
    p_side.hand_off(transport, "one-draft", prompts["one-draft"], t0=22, d1=23)
    d_side.step(transport)
    p_side.step(transport)

    assert d_side.inserted == {"ok": (20, 21)}
    for layer, kv in zip(d_side.layers, sent_kv):
        assert gather_prompt_kv(layer, d_side.blocks["ok"], len(prompts["ok"])).tobytes() == kv.tobytes()
    assert d_side.finished == {"eos": ((EOS,), "stop")}
    assert d_side.failed["one-draft"].startswith("PD+MTP: request one-draft arrived from P with 1 draft id")
    _assert_drained(p_side, d_side, transport)


def test_dropped_handoff_is_reclaimed_on_both_sides():
    """I10 "drop P's result": D fails the request at its deadline; P frees its blocks at its own deadline."""
    clock = FakeClock()
    transport = FaultyTransport(clock=clock)
    p_side, d_side = _PrefillSide(clock, seed=3), _DecodeSide(clock, seed=4)
    d_side.preallocate("r0", 5)
    transport.inject_fault(Fault.DROP)
    p_side.hand_off(transport, "r0", [1, 2, 3, 4, 5], t0=20, d1=21)
    for _ in range(25):
        clock.advance(1.0)
        d_side.step(transport)
        p_side.step(transport)
    assert d_side.failed == {"r0": "PD: request r0: prefill result did not complete within 10 s"}
    _assert_drained(p_side, d_side, transport)


def test_handoff_arriving_after_the_deadline_is_acked_but_not_inserted():
    """I10 "stall the transfer": D has failed the request already; the late hand-off is acked (P frees) and
    dropped, never inserted into a slot whose blocks were freed."""
    clock = FakeClock()
    transport = FaultyTransport(clock=clock)
    p_side, d_side = _PrefillSide(clock, seed=5), _DecodeSide(clock, seed=6)
    d_side.preallocate("r0", 5)
    transport.inject_fault(Fault.STALL, stall_s=15.0)
    p_side.hand_off(transport, "r0", [1, 2, 3, 4, 5], t0=20, d1=21)
    for _ in range(16):
        clock.advance(1.0)
        d_side.step(transport)
        p_side.step(transport)
    assert "r0" in d_side.failed and d_side.inserted == {}
    _assert_drained(p_side, d_side, transport)
