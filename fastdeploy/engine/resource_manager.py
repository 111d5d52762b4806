"""Owns the instance's slots and paged KV block ids: who holds what, and the one way to give it back.

Every block is in exactly one place: the free pool, the `block_ids` of a request that holds a slot, or held for a
transfer under the id of a finished request whose KV the PD connector still needs (P until its hand-off is sent,
D while P may still write into the blocks). The connector never holds block ids: `Scheduler.finish` asks it whether
to keep a finished request's blocks ("delay free"), and the engine frees them when the connector reports that
request's transfer finished or expired (docs/design.md §8).
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from fastdeploy.schema.request import Request


@dataclass(slots=True, frozen=True)
class ResourceStats:
    free_slots: int
    total_slots: int
    free_kv_blocks: int
    total_kv_blocks: int
    running_requests: int
    held_kv_blocks: int = 0     # kept for a transfer under finished requests (counted in neither free nor running)


class ResourceManager:
    """Slots are handed out lowest index first; block ids in FIFO order of release (deterministic runs)."""

    def __init__(self, num_slots: int, num_kv_blocks: int, block_size: int, blocks_per_seq: int):
        self.num_slots = num_slots
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.blocks_per_seq = blocks_per_seq
        self._free_slots = list(range(num_slots))
        self._free_blocks = deque(range(num_kv_blocks))
        self._slot_owner: dict[int, Request] = {}
        self._held: dict[str, list[int]] = {}        # finished request id -> blocks kept for its transfer

    def num_blocks_for(self, num_positions: int) -> int:
        """Blocks covering positions 0 .. num_positions - 1, capped at the block-table width."""
        return min(-(-num_positions // self.block_size), self.blocks_per_seq)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

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
        if missing > len(self._free_blocks):
            return False
        request.block_ids.extend(self._free_blocks.popleft() for _ in range(missing))
        return True

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
            self._free_blocks.extend(request.block_ids)
        request.block_ids = []

    def free_held(self, request_id: str) -> int:
        """The transfer of a finished request is over: its held blocks go back to the pool. Returns how many;
        0 when none are held (a second report frees nothing twice)."""
        block_ids = self._held.pop(request_id, [])
        self._free_blocks.extend(block_ids)
        return len(block_ids)

    def is_held(self, request_id: str) -> bool:
        return request_id in self._held

    @property
    def num_held_blocks(self) -> int:
        return sum(len(b) for b in self._held.values())

    def held_request_ids(self) -> list[str]:
        return sorted(self._held)

    def check_invariant(self) -> None:
        """free + owned by requests holding a slot + held for transfers == all blocks, no id twice (tests run it
        after every step); AssertionError naming what is wrong."""
        places = [("free", list(self._free_blocks))]
        places += [(f"request {r.request_id}", r.block_ids) for r in self._slot_owner.values()]
        places += [(f"held for {rid}", b) for rid, b in self._held.items()]
        seen: dict[int, str] = {}
        for where, block_ids in places:
            for block in block_ids:
                if block in seen:
                    raise AssertionError(f"KV block {block} is both {seen[block]} and {where}")
                seen[block] = where
        if sorted(seen) != list(range(self.num_kv_blocks)):
            lost = sorted(set(range(self.num_kv_blocks)) - set(seen))
            raise AssertionError(f"KV blocks {lost} are nowhere (leaked), or ids outside the pool were returned")
        if len(self._free_slots) + len(self._slot_owner) != self.num_slots:
            raise AssertionError(f"{len(self._free_slots)} free + {len(self._slot_owner)} owned slots != "
                                 f"{self.num_slots}")

    def stats(self) -> ResourceStats:
        return ResourceStats(free_slots=len(self._free_slots), total_slots=self.num_slots,
                             free_kv_blocks=len(self._free_blocks), total_kv_blocks=self.num_kv_blocks,
                             running_requests=len(self._slot_owner), held_kv_blocks=self.num_held_blocks)
