"""Owns the instance's slots and paged KV block ids: who holds what, and the one way to give it back."""
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

    def release(self, request: Request) -> None:
        """The release path of a request: its slot and every KV block it holds go back to the pools."""
        if request.slot is not None:
            del self._slot_owner[request.slot]
            heapq.heappush(self._free_slots, request.slot)
            request.slot = None
        self.release_blocks(request.block_ids)
        request.block_ids = []

    def take_blocks(self, request: Request) -> list[int]:
        """Move the request's blocks out of it: the caller (P's hand-off, which holds them until D acknowledges)
        owns them from now on and gives them back with `release_blocks`."""
        block_ids, request.block_ids = request.block_ids, []
        return block_ids

    def release_blocks(self, block_ids: list[int]) -> None:
        """Blocks no request holds any more (taken with `take_blocks`) go back to the pool."""
        self._free_blocks.extend(block_ids)

    def stats(self) -> ResourceStats:
        return ResourceStats(free_slots=len(self._free_slots), total_slots=self.num_slots,
                             free_kv_blocks=len(self._free_blocks), total_kv_blocks=self.num_kv_blocks,
                             running_requests=len(self._slot_owner))
