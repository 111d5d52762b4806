"""The KV block pool beneath the resource manager: reference counts, and the prefix cache of full blocks.

A block is in exactly one of three states (PD_MTP_FLOW §13):

* free and uncached: reference count 0, no key; handed out first;
* cached and unreferenced: reference count 0, its key in the cache; in the LRU queue, evicted (its key dropped)
  least recently freed first when no uncached block is left;
* referenced: reference count = the number of places that hold it (running requests' block lists and blocks held
  for a transfer), with or without a key; never evicted.

A block key names the KV of a whole block: BLAKE3 (16 bytes) chained over the parent block's key, the block's
token ids and the instance identity (model, dtype, K, block size) with the request's `cache_salt` mixed into
block 0's (`salted_root`), and under MTP the token after the block too
(the MTP KV at a block's last position depends on it, PD_MTP_FLOW §13). A collision-resistant hash, because
clients choose the tokens: with a fast non-cryptographic one (xxh3) a client could craft a prompt whose block key
equals another prompt's and be served that prompt's KV, or plant its own KV under it (docs/design.md §5).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

import blake3
import numpy as np

KEY_BYTES = 16   # 128-bit keys: a birthday bound of 2^64 hashes for any collision


def salted_root(identity: bytes, salt: str | None) -> bytes:
    """What block 0's key is chained from: the instance identity, with the request's `cache_salt` mixed in when it
    has one (length-prefixed, so no salt can imitate another), so that requests salted differently never share a
    block."""
    if salt is None:
        return identity
    encoded = salt.encode()
    return blake3.blake3(b"cache_salt" + len(encoded).to_bytes(4, "little") + encoded + identity).digest(KEY_BYTES)


def block_keys(token_ids: Sequence[int], num_blocks: int, block_size: int, identity: bytes,
               next_token_in_key: bool, parent: Sequence[bytes] = (), salt: str | None = None) -> list[bytes]:
    """The keys of blocks 0 .. num_blocks - 1 of `token_ids`, extending the already known keys `parent`
    (a prefix of the result). Block j covers tokens j*bs .. (j+1)*bs - 1, plus token (j+1)*bs when
    `next_token_in_key`; the caller guarantees those tokens exist. `salt`: the request's cache salt."""
    keys = list(parent)
    tokens = np.asarray(token_ids, np.int64)
    extra = 1 if next_token_in_key else 0
    root = identity if keys else salted_root(identity, salt)   # only block 0 starts from the root
    for j in range(len(keys), num_blocks):
        digest = blake3.blake3(keys[-1] if keys else root)
        digest.update(tokens[j * block_size:(j + 1) * block_size + extra].tobytes())
        keys.append(digest.digest(KEY_BYTES))
    return keys


class BlockPool:
    """Block ids 0 .. num_blocks - 1. Uncached blocks go out in FIFO order of release (deterministic runs)."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._uncached: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()   # cached, reference count 0; oldest first
        self._key_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks a request can get now: uncached ones and cached ones nobody references."""
        return len(self._uncached) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    def allocate(self, n: int) -> list[int]:
        """`n` fresh blocks with reference count 1, uncached ones first, then the least recently used cached
        ones (their keys dropped). The caller checks `num_free` first."""
        if n > self.num_free:
            raise RuntimeError(f"BlockPool.allocate: {n} blocks asked, {self.num_free} free")
        blocks = []
        for _ in range(n):
            if self._uncached:
                block = self._uncached.popleft()
            else:
                block, _ = self._evictable.popitem(last=False)
                del self._block_of[self._key_of.pop(block)]
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def match(self, keys: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of `keys` (nothing is taken: see `share`)."""
        blocks = []
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def share(self, blocks: Sequence[int]) -> None:
        """One more reference to each cached block; an unreferenced one leaves the LRU queue."""
        for block in blocks:
            if block not in self._key_of:
                raise RuntimeError(f"BlockPool.share: block {block} is not cached")
            if self.ref_counts[block] == 0:
                del self._evictable[block]
            self.ref_counts[block] += 1

    def cache(self, block: int, key: bytes) -> None:
        """A referenced block's KV is complete and named by `key`. When another block already holds that key (two
        requests computed the same prefix at once) or this one has a key, nothing changes."""
        if self.ref_counts[block] <= 0:
            raise RuntimeError(f"BlockPool.cache: block {block} is not referenced")
        if key in self._block_of or block in self._key_of:
            return
        self._block_of[key] = block
        self._key_of[block] = key

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block, the last one first: the tail of a chain is evicted before its head,
        which more prompts share."""
        for block in reversed(blocks):
            if self.ref_counts[block] <= 0:
                raise RuntimeError(f"BlockPool.free: block {block} is not referenced")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if block in self._key_of:
                    self._evictable[block] = None
                else:
                    self._uncached.append(block)

    def reset(self) -> int:
        """Drop every cached block nobody references (POST /reset_prefix_cache). Returns how many."""
        dropped = list(self._evictable)
        self._evictable.clear()
        for block in dropped:
            del self._block_of[self._key_of.pop(block)]
        self._uncached.extend(dropped)
        return len(dropped)

    def check(self, references: dict[int, int]) -> None:
        """`references`: block -> how many places hold it. AssertionError naming what is wrong."""
        uncached, evictable = set(self._uncached), set(self._evictable)
        if len(uncached) != len(self._uncached):
            raise AssertionError("a KV block is twice in the free queue")
        for block in range(self.num_blocks):
            where = [name for name, members in (("free", uncached), ("cached-free", evictable)) if block in members]
            held = references.get(block, 0)
            if held and where:
                raise AssertionError(f"KV block {block} is both {where[0]} and held by {held} owner(s)")
            if not held and len(where) != 1:
                raise AssertionError(f"KV block {block} is held by nobody and is in {where or 'no free queue'}")
            if self.ref_counts[block] != held:
                raise AssertionError(f"KV block {block} has reference count {self.ref_counts[block]}, "
                                     f"{held} owner(s) hold it")
            if (block in evictable) != (block in self._key_of and not held):
                raise AssertionError(f"KV block {block}: cached and unreferenced exactly when in the LRU queue")
        if set(references) - set(range(self.num_blocks)):
            raise AssertionError(f"KV block ids outside the pool are held: {sorted(set(references))}")
        if {b: k for k, b in self._block_of.items()} != self._key_of:
            raise AssertionError("the prefix cache's key -> block and block -> key maps disagree")
