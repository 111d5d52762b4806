"""Owns the instance's slots and paged KV block ids: who holds what, and the one way to give it back.

A block is free (uncached, or cached with nobody referencing it: engine/block_pool.py), or referenced by the
`block_ids` of requests that hold a slot and by the blocks held for a transfer under the id of a finished request
whose KV the PD connector still needs (P until its hand-off is sent, D while P may still write into the blocks),
its reference count the number of those places. The connector never holds block ids: `Scheduler.finish` asks it
whether to keep a finished request's blocks ("delay free"), and the engine frees them when the connector reports
that request's transfer finished or expired (docs/design.md §8).

With prefix caching, a request's leading full prompt blocks may be shared cached blocks (`match_prefix`; on D
before its reservation, so P sends only the rest, PD_MTP_FLOW §13.6), and the blocks it computed or received are
cached as soon as their KV is exact (`cache_computed_blocks`; PD_MTP_FLOW §13).
"""
from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass

from fastdeploy.engine.block_pool import BlockPool, block_keys
from fastdeploy.schema.request import Request


@dataclass(slots=True, frozen=True)
class ResourceStats:
    free_slots: int
    total_slots: int
    free_kv_blocks: int
    total_kv_blocks: int
    running_requests: int
    held_kv_blocks: int = 0     # kept for a transfer under finished requests (counted in neither free nor running)
    cached_kv_blocks: int = 0   # blocks the prefix cache names (free ones among them count as free)


@dataclass(slots=True)
class PrefixCacheCounters:
    """Cumulative, since the instance started: lookups at a request's first admission (docs/serving.md
    "Metrics")."""

    requests: int = 0          # requests looked up
    hit_requests: int = 0      # ... of which at least one block hit
    query_tokens: int = 0      # their prompt tokens
    hit_tokens: int = 0        # ... whose KV came from the cache


class ResourceManager:
    """Slots are handed out lowest index first; block ids in FIFO order of release (deterministic runs)."""

    def __init__(self, num_slots: int, num_kv_blocks: int, block_size: int, blocks_per_seq: int,
                 cache_identity: bytes | None = None, next_token_in_key: bool = False, prefix_caching: bool = True):
        """`cache_identity`: what besides the tokens makes a block's KV (model, dtype, K, block size), the root of
        every block key; None turns prefix caching off, and so does `prefix_caching` False (the keys can still be
        computed: `prefix_keys`). `next_token_in_key`: the KV of a block depends on the token after it (MTP)."""
        self.num_slots = num_slots
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.blocks_per_seq = blocks_per_seq
        self.cache_identity = cache_identity
        self.next_token_in_key = next_token_in_key
        self._caching = prefix_caching and cache_identity is not None
        self.prefix_counters = PrefixCacheCounters()
        self._free_slots = list(range(num_slots))
        self._pool = BlockPool(num_kv_blocks)
        self._slot_owner: dict[int, Request] = {}
        self._held: dict[str, list[int]] = {}        # finished request id -> blocks kept for its transfer

    def num_blocks_for(self, num_positions: int) -> int:
        """Blocks covering positions 0 .. num_positions - 1, capped at the block-table width."""
        return min(-(-num_positions // self.block_size), self.blocks_per_seq)

    @property
    def num_free_blocks(self) -> int:
        return self._pool.num_free

    @property
    def prefix_caching(self) -> bool:
        return self._caching

    def can_allocate_slot(self) -> bool:
        return bool(self._free_slots)

    def allocate_slot(self, request: Request) -> int:
        slot = heapq.heappop(self._free_slots)
        self._slot_owner[slot] = request
        request.slot = slot
        return slot

    def owner(self, slot: int) -> Request | None:
        return self._slot_owner.get(slot)

    def grow_blocks(self, request: Request, num_positions: int) -> bool:
        """Give `request` blocks for positions 0 .. num_positions - 1; all or nothing. True if it has them."""
        missing = self.num_blocks_for(num_positions) - len(request.block_ids)
        if missing <= 0:
            return True
        if missing > self._pool.num_free:
            return False
        request.block_ids.extend(self._pool.allocate(missing))
        return True

    # ---- the prefix cache (PD_MTP_FLOW §13) ----

    def prefix_keys(self, token_ids: list[int], num_blocks: int, salt: str | None = None) -> bytes:
        """The keys of the first `num_blocks` blocks of `token_ids` (salted with the request's `cache_salt`),
        concatenated: what a hand-off's tag covers for the blocks D reused instead of receiving them (PD_MTP_FLOW
        §13.6). P's and D's are equal only when both salted the request alike."""
        if not num_blocks:
            return b""
        if self.cache_identity is None:
            raise RuntimeError("ResourceManager.prefix_keys: this instance has no cache identity")
        return b"".join(block_keys(token_ids, num_blocks, self.block_size, self.cache_identity,
                                   self.next_token_in_key, salt=salt))

    def _keys(self, request: Request, num_blocks: int) -> list[bytes]:
        if len(request.block_keys) < num_blocks:
            request.block_keys = block_keys(request.known_token_ids, num_blocks, self.block_size,
                                            self.cache_identity, self.next_token_in_key, request.block_keys,
                                            salt=request.params.cache_salt)
        return request.block_keys[:num_blocks]

    def match_prefix(self, request: Request) -> int:
        """Give a request that holds no block the cached blocks of its longest cached prefix of known tokens and
        return the number of tokens they cover (0 with caching off). At least the last known token is left to
        compute (its logits are needed), so a hit never covers the block that holds it: nothing the request
        computes is written into a shared block."""
        if not self.prefix_caching or request.block_ids:
            return 0
        limit = min((request.prefill_len - 1) // self.block_size, self.blocks_per_seq)
        blocks = self._pool.match(self._keys(request, limit))
        self._pool.share(blocks)
        request.block_ids = blocks
        request.num_cached_blocks = len(blocks)
        return len(blocks) * self.block_size

    def unmatch_prefix(self, request: Request) -> None:
        """Undo `match_prefix` for a request that could not be admitted after all."""
        self._pool.free(request.block_ids)
        request.block_ids = []
        request.num_cached_blocks = 0

    def count_lookup(self, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        counters = self.prefix_counters
        counters.requests += 1
        counters.hit_requests += num_hit_tokens > 0
        counters.query_tokens += num_prompt_tokens
        counters.hit_tokens += num_hit_tokens

    def cache_computed_blocks(self, request: Request, num_tokens: int) -> None:
        """The KV of the request's first `num_tokens` known tokens is written and exact (target and MTP): name in
        the cache every full block among them whose key the known tokens determine — with the next token in the
        key, only blocks whose next token is a token of this residency's prefill (PD_MTP_FLOW §13)."""
        if not self.prefix_caching:
            return
        extra = 1 if self.next_token_in_key else 0
        exact = min(num_tokens, request.prefill_len - extra) // self.block_size
        exact = min(exact, len(request.block_ids))
        if exact <= request.num_cached_blocks:
            return
        for j, key in enumerate(self._keys(request, exact)[request.num_cached_blocks:], request.num_cached_blocks):
            self._pool.cache(request.block_ids[j], key)
        request.num_cached_blocks = exact

    def reset_prefix_cache(self) -> int:
        """Drop every cached block no request references; returns how many."""
        return self._pool.reset()

    def release(self, request: Request, keep_blocks: bool = False) -> None:
        """The release path of a request: its slot goes back to the pool, and so does every KV block it holds —
        unless `keep_blocks`, when they stay held under its id until `free_held` (a transfer still reads or
        writes them)."""
        if request.slot is not None:
            del self._slot_owner[request.slot]
            heapq.heappush(self._free_slots, request.slot)
            request.slot = None
        if keep_blocks and request.block_ids:
            if request.request_id in self._held:   # admission refuses such an id (LLMEngine.add_request)
                raise RuntimeError(f"ResourceManager.release: request {request.request_id} already has blocks held "
                                   "for a transfer")
            self._held[request.request_id] = request.block_ids
        else:
            self._pool.free(request.block_ids)
        request.block_ids = []
        request.num_cached_blocks = 0

    def free_held(self, request_id: str) -> int:
        """The transfer of a finished request is over: its held blocks go back to the pool. Returns how many;
        0 when none are held (a second report frees nothing twice)."""
        block_ids = self._held.pop(request_id, [])
        self._pool.free(block_ids)
        return len(block_ids)

    def is_held(self, request_id: str) -> bool:
        return request_id in self._held

    @property
    def num_held_blocks(self) -> int:
        return sum(len(b) for b in self._held.values())

    def has_held(self) -> bool:
        """Some finished request's blocks are still kept for its transfer."""
        return bool(self._held)

    def check_invariant(self) -> None:
        """Every block is free (uncached, or cached and unreferenced), or referenced with reference count = the
        number of requests holding a slot and held transfers that list it, never both; a request lists a block
        once; slots free + owned == all (tests run it after every step). AssertionError naming what is wrong."""
        references: Counter[int] = Counter()
        owners = [(f"request {r.request_id}", r.block_ids) for r in self._slot_owner.values()]
        owners += [(f"held for {rid}", b) for rid, b in self._held.items()]
        for where, block_ids in owners:
            if len(set(block_ids)) != len(block_ids):
                raise AssertionError(f"{where} lists a KV block twice: {block_ids}")
            references.update(block_ids)
        self._pool.check(dict(references))
        if len(self._free_slots) + len(self._slot_owner) != self.num_slots:
            raise AssertionError(f"{len(self._free_slots)} free + {len(self._slot_owner)} owned slots != "
                                 f"{self.num_slots}")

    def stats(self) -> ResourceStats:
        return ResourceStats(free_slots=len(self._free_slots), total_slots=self.num_slots,
                             free_kv_blocks=self._pool.num_free, total_kv_blocks=self.num_kv_blocks,
                             running_requests=len(self._slot_owner), held_kv_blocks=self.num_held_blocks,
                             cached_kv_blocks=self._pool.num_cached)
