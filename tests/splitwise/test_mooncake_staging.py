"""P's Mooncake staging pool (splitwise/mooncake.py `StagingPool`, docs/design.md §8): P copies a hand-off's KV
into a slot and writes from there, so its blocks may be reused once the copy is done; the slot is given back when
the transfer engine lets go of the write (landed, failed, or its own wait returning after P's timeout); a full
pool, or a hand-off larger than a slot, writes from P's blocks in place. A fake engine that moves the bytes only
when waited for, as the real one may."""
from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.splitwise.mooncake import Destination, MooncakeError, MooncakeKVTransfer, StagingPool, \
    WritesStillRunning
from fastdeploy.worker.kv_transfer import PromptKVPort

from .mooncake_layout import BLOCK_SIZE, D_BLOCKS, LAYER_TAILS, NUM_BLOCKS, NUM_TOKENS, P_BLOCKS


class DeferredEngine:
    """The MooncakeEngine surface: `submit_write` records the writes, `wait` moves them (or fails as told)."""

    session_address = "127.0.0.1:1"

    def __init__(self):
        self.batches: list[list[tuple[int, int, int]]] = []
        self.fail_submit = False
        self.fail_wait: Exception | None = None

    def register(self, regions) -> None:
        self.registered = list(regions)

    def submit_write(self, session, sources, destinations, lengths) -> int:
        if self.fail_submit:
            raise MooncakeError("Mooncake transfer engine: writing could not start")
        self.batches.append(list(zip(sources, destinations, lengths)))
        return len(self.batches)

    def wait(self, session, *batches, timeout_s: float | None = None) -> None:
        if self.fail_wait is not None:
            raise self.fail_wait
        for batch in batches:
            for source, destination, length in self.batches[batch - 1]:
                ctypes.memmove(destination, source, length)

    def close(self) -> None:
        """Nothing is held."""


def _port(seed: int | None) -> PromptKVPort:
    port = PromptKVPort(KVCache(NUM_BLOCKS, BLOCK_SIZE, LAYER_TAILS), num_target_layers=2)
    rng = np.random.default_rng(seed)
    for i in range(len(LAYER_TAILS)):
        view = port.kv.host_view(i)
        view[...] = rng.standard_normal(view.shape).astype(np.float32) if seed is not None else 0
    return port


def _pair(slots: int = 2, tokens: int = NUM_TOKENS):
    engine, p_port, d_port = DeferredEngine(), _port(7), _port(None)
    transfer = MooncakeKVTransfer(p_port, engine, StagingPool.sized_for(p_port, tokens, slots))
    destination = Destination(engine.session_address, tuple(D_BLOCKS), tuple(d_port.block_regions()))
    return engine, p_port, d_port, transfer, destination


def _bytes(port: PromptKVPort, blocks) -> bytes:
    return b"".join(bytes(chunk) for chunk in port.prompt_kv_chunks(blocks, NUM_TOKENS))


def _inside(address: int, region: tuple[int, int]) -> bool:
    return region[0] <= address < region[0] + region[1]


def test_a_staged_write_frees_p_blocks_at_the_copy_and_its_slot_once_landed():
    """P's blocks overwritten after the copy (another request reusing them) change nothing D receives or the tag
    reads; every write reads the staging slot; the slot is taken until the write landed."""
    engine, p_port, d_port, transfer, destination = _pair()
    want = _bytes(p_port, P_BLOCKS)
    copied = threading.Event()
    writes = transfer.write_to(destination, P_BLOCKS, NUM_TOKENS, on_copied=copied.set)
    first = bytes(next(writes))
    assert copied.is_set() and transfer.staged_writes() == 1
    assert all(_inside(source, transfer.staging.region()) for source, _, _ in engine.batches[0])
    for i in range(len(LAYER_TAILS)):   # P's blocks reused by another request
        p_port.kv.host_view(i)[...] = -1.0
    hashed = first + b"".join(bytes(chunk) for chunk in writes)
    assert hashed == want and _bytes(d_port, D_BLOCKS) == want
    assert transfer.staged_writes() == 0 and transfer.staging.in_place_writes == 0


@pytest.mark.parametrize("where", ["submit", "wait"])
def test_a_failed_staged_write_gives_its_slot_back(where):
    engine, _, _, transfer, destination = _pair()
    engine.fail_submit = where == "submit"
    engine.fail_wait = MooncakeError("Mooncake transfer engine: a write failed") if where == "wait" else None
    with pytest.raises(MooncakeError):
        list(transfer.write_to(destination, P_BLOCKS, NUM_TOKENS))
    assert transfer.staged_writes() == 0


def test_a_timed_out_staged_write_keeps_its_slot_until_the_engine_lets_go():
    """The engine may still read the slot after P's timeout: the slot stays taken until `ended`; the error says
    the source was the slot (P's blocks are already free)."""
    engine, _, _, transfer, destination = _pair()
    ended = threading.Event()
    engine.fail_wait = WritesStillRunning("Mooncake transfer engine: the writes did not land within 1 s", ended)
    with pytest.raises(WritesStillRunning) as raised:
        list(transfer.write_to(destination, P_BLOCKS, NUM_TOKENS))
    assert raised.value.staged
    assert transfer.staged_writes() == 1
    ended.set()
    assert transfer.staged_writes() == 0


def test_a_full_pool_writes_from_p_blocks_in_place_and_stages_again_once_a_slot_is_free():
    """One slot, taken by a write in flight: the next write reads P's blocks (no copy, `on_copied` not called,
    counted); once the first landed, a write is staged again. D receives P's bytes either way."""
    engine, p_port, d_port, transfer, destination = _pair(slots=1)
    want = _bytes(p_port, P_BLOCKS)
    in_flight = transfer.write_to(destination, P_BLOCKS, NUM_TOKENS)
    next(in_flight)
    copied = threading.Event()
    assert b"".join(bytes(c) for c in transfer.write_to(destination, P_BLOCKS, NUM_TOKENS,
                                                        on_copied=copied.set)) == want
    assert not copied.is_set() and transfer.staging.in_place_writes == 1
    assert not any(_inside(source, transfer.staging.region()) for source, _, _ in engine.batches[1])
    list(in_flight)
    assert transfer.staged_writes() == 0 and _bytes(d_port, D_BLOCKS) == want
    list(transfer.write_to(destination, P_BLOCKS, NUM_TOKENS, on_copied=copied.set))
    assert copied.is_set() and transfer.staging.in_place_writes == 1


def test_a_hand_off_larger_than_a_slot_is_written_in_place():
    engine, p_port, d_port, transfer, destination = _pair(tokens=BLOCK_SIZE)   # a slot holds one block
    list(transfer.write_to(destination, P_BLOCKS, NUM_TOKENS))
    assert transfer.staging.in_place_writes == 1 and _bytes(d_port, D_BLOCKS) == _bytes(p_port, P_BLOCKS)


def test_the_pool_is_registered_with_the_engine_and_sized_by_its_rule():
    """Registered once with the KV cache; each slot holds the longest hand-off (whole blocks of every layer)."""
    engine, p_port, _, transfer, _ = _pair(slots=3, tokens=NUM_TOKENS)
    blocks = -(-NUM_TOKENS // BLOCK_SIZE)
    assert transfer.staging.slots == 3
    assert transfer.staging.slot_bytes == blocks * sum(n for _, n in p_port.block_regions())
    assert engine.registered == [*p_port.memory_regions(), transfer.staging.region()]
