"""The prefix cache's block pool (engine/block_pool.py, PD_MTP_FLOW §13).

A hypothesis property test drives random admit / share / finish / evict / preempt / abort / hold-for-transfer /
reset sequences through a BlockPool the way the resource manager does, and after every operation checks the pool
against an independent model of who holds what: reference counts equal the holders, no block is both free and
held, eviction never hands out a referenced block, and a hit returns only a block whose KV was written for that
key and has not been overwritten since.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdeploy.engine.block_pool import BlockPool, block_keys

NUM_BLOCKS = 12
BLOCK_SIZE = 2
IDENTITY = b"fd-toy|float32|k=1|block_size=2"
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 9, 9, 9, 9, 9], [7, 7, 7, 7, 7, 7, 7, 7, 7]]


class Model:
    """The test's own account: request id -> blocks, blocks held for transfers, and what each block's KV is."""

    def __init__(self):
        self.pool = BlockPool(NUM_BLOCKS)
        self.owners: dict[str, list[int]] = {}
        self.held: dict[str, list[int]] = {}
        self.content: dict[int, bytes | None] = {}     # block -> the key whose KV it holds (None: other KV)

    def references(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for blocks in (*self.owners.values(), *self.held.values()):
            for block in blocks:
                counts[block] = counts.get(block, 0) + 1
        return counts

    def admit(self, rid: str, tokens: list[int], extra_blocks: int) -> None:
        """match + share the cached prefix, fresh blocks for the rest, then cache the full fresh blocks."""
        if rid in self.owners or rid in self.held:
            return
        num_full = (len(tokens) - 1) // BLOCK_SIZE
        keys = block_keys(tokens, num_full, BLOCK_SIZE, IDENTITY, next_token_in_key=True)
        hit = self.pool.match(keys)
        for block, key in zip(hit, keys):
            assert self.content[block] == key, f"block {block} hit for a key whose KV it does not hold"
        need = num_full - len(hit) + extra_blocks
        referenced_before = set(self.references())
        self.pool.share(hit)
        if need > self.pool.num_free:
            self.pool.free(hit)
            return
        fresh = self.pool.allocate(need)
        assert not set(fresh) & referenced_before, "a referenced block was handed out"
        for block in fresh:
            self.content[block] = None                  # the request overwrites it
        blocks = hit + fresh
        self.owners[rid] = blocks
        for j in range(len(hit), num_full):
            self.pool.cache(blocks[j], keys[j])
            if self.content[blocks[j]] is None:
                self.content[blocks[j]] = keys[j]

    def release(self, rid: str, hold: bool = False) -> None:
        blocks = self.owners.pop(rid, None)
        if blocks is None:
            return
        if hold:
            self.held[rid] = blocks
        else:
            self.pool.free(blocks)

    def free_held(self, rid: str) -> None:
        self.pool.free(self.held.pop(rid, []))

    def check(self) -> None:
        self.pool.check(self.references())
        for block in range(NUM_BLOCKS):   # a cached block still holds the KV its key names
            key = self.pool._key_of.get(block)
            assert key is None or self.content.get(block) == key, f"block {block} is cached under a stale key"


IDS = ["a", "b", "c", "d"]
OPERATIONS = st.one_of(
    st.tuples(st.just("admit"), st.sampled_from(IDS), st.integers(0, 2), st.integers(2, 9), st.integers(0, 3)),
    st.tuples(st.sampled_from(["finish", "preempt", "abort", "hold"]), st.sampled_from(IDS)),
    st.tuples(st.just("free_held"), st.sampled_from(IDS)),
    st.tuples(st.just("evict"), st.integers(1, NUM_BLOCKS)),
    st.tuples(st.just("reset")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(OPERATIONS, max_size=40))
def test_pool_keeps_reference_counts_and_free_queues_consistent(operations):
    model = Model()
    for i, op in enumerate(operations):
        kind = op[0]
        if kind == "admit":
            _, rid, prefix, length, extra = op
            model.admit(rid, PREFIXES[prefix][:length], extra)
        elif kind == "preempt":           # released, then recomputed from its prompt: admitted again
            model.release(op[1])
            model.admit(op[1], PREFIXES[0], 1)
        elif kind in ("finish", "abort", "hold"):
            model.release(op[1], hold=kind == "hold")
        elif kind == "free_held":
            model.free_held(op[1])
        elif kind == "evict":             # a request with no cached prefix takes fresh blocks, evicting LRU ones
            referenced = set(model.references())
            fresh = model.pool.allocate(min(op[1], model.pool.num_free))
            assert not set(fresh) & referenced, "eviction handed out a referenced block"
            for block in fresh:
                model.content[block] = None
            model.owners[f"fresh{i}"] = fresh
        else:
            model.pool.reset()
        model.check()
    for rid in list(model.owners):
        model.release(rid)
    for rid in list(model.held):
        model.free_held(rid)
    model.check()
    assert model.pool.num_free == NUM_BLOCKS


def test_lru_evicts_the_least_recently_freed_cached_block_tail_first():
    pool = BlockPool(4)
    keys = block_keys([1, 2, 3, 4, 5], 2, BLOCK_SIZE, IDENTITY, next_token_in_key=True)
    first = pool.allocate(2)
    for block, key in zip(first, keys):
        pool.cache(block, key)
    pool.free(first)                      # the tail goes into the queue before the head
    assert pool.allocate(2) == [2, 3]     # uncached blocks first
    assert pool.allocate(1) == [first[1]], "the chain's tail is evicted before its head"
    assert pool.match(keys) == [first[0]]   # the tail's key went with its block


def test_keys_chain_over_the_parent_the_next_token_and_the_identity():
    tokens = [1, 2, 3, 4, 5]
    with_next = block_keys(tokens, 2, BLOCK_SIZE, IDENTITY, next_token_in_key=True)
    assert block_keys([1, 2, 3, 4, 6], 2, BLOCK_SIZE, IDENTITY, True)[0] == with_next[0]
    assert block_keys([1, 2, 3, 4, 6], 2, BLOCK_SIZE, IDENTITY, True)[1] != with_next[1], "next token"
    assert block_keys([1, 2, 3, 4, 6], 2, BLOCK_SIZE, IDENTITY, False)[1] == \
        block_keys(tokens, 2, BLOCK_SIZE, IDENTITY, False)[1]
    assert block_keys([9, 2, 3, 4, 5], 2, BLOCK_SIZE, IDENTITY, True)[1] != with_next[1], "parent"
    assert block_keys(tokens, 2, BLOCK_SIZE, b"other", True)[0] != with_next[0], "identity"
    assert block_keys(tokens, 2, BLOCK_SIZE, IDENTITY, True, parent=with_next[:1]) == with_next


def test_misuse_is_refused():
    pool = BlockPool(2)
    with pytest.raises(RuntimeError, match="not referenced"):
        pool.free([0])
    with pytest.raises(RuntimeError, match="not cached"):
        pool.share([0])
    with pytest.raises(RuntimeError, match="2 free"):
        pool.allocate(3)
