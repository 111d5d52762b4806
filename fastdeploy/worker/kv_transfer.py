"""The prompt KV of one request as the P→D hand-off carries it: per layer, positions 0..L−1 (PD_MTP_FLOW §3).

P reads the target and MTP layers of a request's blocks into dense `[L, *tail]` arrays; D writes the received
arrays into the blocks it preallocated. Each KV byte is copied once per side (docs/benchmarks.md): on a host cache
the port works on NumPy views of the cache memory (KVCache.host_view), so P gathers the request's blocks straight
into the send buffer and D writes the received frames straight into its blocks. For a transfer engine that writes
D's blocks itself (splitwise/mooncake.py) the port also tells where every block lives and hashes blocks in place.
The engine-side PD code sees only this port, so it stays free of Paddle.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import paddle

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.precision import kv_storage_dtype
from fastdeploy.splitwise import KVLayout, KVSpec, PlacedKV


class PromptKVPort:
    """Reads and writes positions 0..L−1 of a request's blocks, target layers first (docs/design.md §3)."""

    def __init__(self, kv: KVCache, num_target_layers: int):
        self.kv = kv
        self.num_target_layers = num_target_layers
        tails = tuple(tuple(t) for t in kv.layer_tails)
        self.layout = KVLayout(tails[:num_target_layers], tails[num_target_layers:], kv.dtype)

    def read_prompt_kv(self, block_ids: Sequence[int],
                       num_tokens: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(target layers, MTP layers), each array [L, *tail], copied out of the cache once. On a host cache the
        arrays lie back to back in one buffer, in the hand-off's order, so they travel as one frame and are hashed
        in one pass."""
        ids = self._block_ids("read_prompt_kv", block_ids, num_tokens)
        views = [self.kv.host_view(i) for i in range(len(self.kv.layers))]
        if any(view is None for view in views):   # a device cache: gather there, then one copy to the host
            blocks, offsets = self._locate(block_ids, num_tokens)
            arrays = [self.kv.read(i, blocks, offsets).numpy() for i in range(len(self.kv.layers))]
            return arrays[:self.num_target_layers], arrays[self.num_target_layers:]
        size = self.kv.block_size
        full, rest = divmod(num_tokens, size)
        buffer = np.empty(sum(num_tokens * v[0, 0].nbytes for v in views), np.uint8)
        arrays, offset = [], 0
        for view in views:
            nbytes = num_tokens * view[0, 0].nbytes
            out = buffer[offset:offset + nbytes].view(view.dtype).reshape(num_tokens, *view.shape[2:])
            offset += nbytes
            if full:   # mode="clip": ids are checked above, and "raise" would buffer the whole gather once more
                np.take(view, ids[:full], axis=0, out=out[:full * size].reshape(full, size, *view.shape[2:]),
                        mode="clip")
            if rest:
                out[full * size:] = view[ids[full], :rest]
            arrays.append(out)
        return arrays[:self.num_target_layers], arrays[self.num_target_layers:]

    def write_prompt_kv(self, block_ids: Sequence[int], kv_target: Sequence[np.ndarray],
                        kv_mtp: Sequence[np.ndarray]) -> None:
        """Store the hand-off's arrays [L, *tail] at positions 0..L−1 of `block_ids`, every layer, copying each
        byte once from where it was received."""
        arrays = [*kv_target, *kv_mtp]
        if len(arrays) != len(self.kv.layers):
            raise ValueError(f"PromptKVPort.write_prompt_kv: {len(arrays)} KV arrays for a cache of "
                             f"{len(self.kv.layers)} layers")
        num_tokens = int(arrays[0].shape[0])
        ids = self._block_ids("write_prompt_kv", block_ids, num_tokens)
        full, rest = divmod(num_tokens, self.kv.block_size)
        for i, array in enumerate(arrays):
            tail = tuple(self.kv.layer_tails[i])
            if tuple(array.shape) != (num_tokens, *tail):
                raise ValueError(f"PromptKVPort.write_prompt_kv: array {i} has shape {list(array.shape)}, layer {i} "
                                 f"holds [{num_tokens}, {', '.join(map(str, tail))}]")
            view = self.kv.host_view(i)
            if view is None:
                blocks, offsets = self._locate(block_ids, num_tokens)
                self.kv.write(i, blocks, offsets, paddle.to_tensor(np.ascontiguousarray(array)))
                continue
            if full:
                view[ids[:full]] = array[:full * self.kv.block_size].reshape(full, self.kv.block_size, *tail)
            if rest:
                view[ids[full], :rest] = array[full * self.kv.block_size:]

    # ---- in place, for a transfer engine that moves blocks itself (splitwise/mooncake.py), or a streamed hand-off
    # read from P's blocks and written into D's as its pieces arrive (splitwise/kv_stream.py) ----

    @property
    def in_host_memory(self) -> bool:
        """Every layer lies in host memory (its blocks can be read and written where they are)."""
        return all(self.kv.host_view(i) is not None for i in range(len(self.kv.layers)))

    @property
    def block_size(self) -> int:
        return self.kv.block_size

    def placed_kv(self, num_tokens: int) -> PlacedKV:
        """The descriptors of a placed hand-off of `num_tokens` positions (its KV arrays as if gathered)."""
        dtype = kv_storage_dtype(self.kv.dtype).str   # bfloat16: its bits, '<u2' (the KV dtype is in the config hash)
        specs = [KVSpec(dtype, (num_tokens, *tail)) for tail in self.kv.layer_tails]
        return PlacedKV(tuple(specs[:self.num_target_layers]), tuple(specs[self.num_target_layers:]))

    def prompt_kv_chunks(self, block_ids: Sequence[int], num_tokens: int) -> list[memoryview]:
        """The bytes of positions 0..L−1 of every layer, in layer order, as views of the blocks (no copy): the
        order the hand-off tag reads them, so D verifies KV placed in its blocks where it lies."""
        ids = self._block_ids("prompt_kv_chunks", block_ids, num_tokens)
        chunks = []
        for i in range(len(self.kv.layers)):
            view = self._require_view("prompt_kv_chunks", i)
            for first, count, rows in self._runs(ids, num_tokens):
                span = view[first:first + count].reshape(-1, *view.shape[2:])[:rows]
                chunks.append(memoryview(span.reshape(-1).view(np.uint8)))
        return chunks

    def block_regions(self) -> list[tuple[int, int]]:
        """(address of block 0, bytes per block) of each layer: block b of layer l starts at
        address_l + b * bytes_l."""
        return [(v.ctypes.data, v[0].nbytes) for v in
                (self._require_view("block_regions", i) for i in range(len(self.kv.layers)))]

    def row_bytes(self) -> list[int]:
        """Bytes of one position (one cache row) of each layer."""
        return [self._require_view("row_bytes", i)[0, 0].nbytes for i in range(len(self.kv.layers))]

    def prompt_kv_ranges(self, block_ids: Sequence[int], num_tokens: int) -> list[tuple[int, int]]:
        """(address, bytes) of positions 0..L−1 in each block, layer by layer: P's source regions of a request,
        in the tag's order (block j of the request holds positions j*block_size.. of every layer)."""
        ids = self._block_ids("prompt_kv_ranges", block_ids, num_tokens)
        size, ranges = self.kv.block_size, []
        for (base, block_bytes), row in zip(self.block_regions(), self.row_bytes()):
            ranges.extend((base + int(b) * block_bytes, min(size, num_tokens - j * size) * row)
                          for j, b in enumerate(ids))
        return ranges

    def memory_regions(self) -> list[tuple[int, int]]:
        """(address, bytes) of each layer's whole cache: what a transfer engine registers once."""
        regions = self.kv.memory_regions()
        if regions is None:
            raise ValueError("PromptKVPort.memory_regions: the KV cache is not in host memory; the transfer engine "
                             "needs host memory (mooncake-transfer-engine-non-cuda)")
        return regions

    # ---- helpers ----

    def _runs(self, ids: np.ndarray, num_tokens: int) -> list[tuple[int, int, int]]:
        """(first block, number of blocks, positions) of each run of consecutive block ids that holds
        positions 0..L−1, so that contiguous blocks are one chunk."""
        runs, start, size = [], 0, self.kv.block_size
        for j in range(1, len(ids) + 1):
            if j == len(ids) or ids[j] != ids[j - 1] + 1:
                rows = min(num_tokens, j * size) - start * size
                runs.append((int(ids[start]), j - start, rows))
                start = j
        return runs

    def _require_view(self, what: str, layer: int) -> np.ndarray:
        view = self.kv.host_view(layer)
        if view is None:
            raise ValueError(f"PromptKVPort.{what}: layer {layer} of the KV cache is not in host memory")
        return view

    def _block_ids(self, what: str, block_ids: Sequence[int], num_tokens: int) -> np.ndarray:
        """The blocks that hold positions 0..L−1, checked: enough of them and every id inside the cache."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or num_tokens < 1:
            raise ValueError(f"PromptKVPort.{what}: argument 'num_tokens' must be an int >= 1 (got {num_tokens!r})")
        needed = -(-int(num_tokens) // self.kv.block_size)
        ids = np.asarray(block_ids, dtype=np.int64).reshape(-1)
        if ids.size < needed:
            raise ValueError(f"PromptKVPort.{what}: argument 'block_ids' has {ids.size} blocks, {num_tokens} "
                             f"positions need {needed} of {self.kv.block_size}")
        ids = ids[:needed]
        if ids.min() < 0 or ids.max() >= self.kv.num_blocks:
            raise ValueError(f"PromptKVPort.{what}: argument 'block_ids' has an id outside the cache's "
                             f"{self.kv.num_blocks} blocks: {ids.tolist()}")
        return ids

    def _locate(self, block_ids: Sequence[int], num_tokens: int) -> tuple[paddle.Tensor, paddle.Tensor]:
        table = np.asarray(block_ids, np.int64)[None, :]
        return self.kv.locate(table, np.zeros(num_tokens, np.int64), np.arange(num_tokens, dtype=np.int64))
