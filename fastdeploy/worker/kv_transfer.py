"""The prompt KV of one request as the P→D hand-off carries it: per layer, positions 0..L−1 (PD_MTP_FLOW §3).

P reads the target and MTP layers of a request's blocks into dense `[L, *tail]` arrays; D writes the received
arrays into the blocks it preallocated. The engine-side PD code (fastdeploy/engine/pd.py) sees only this port,
so it stays free of Paddle.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import paddle

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.splitwise import KVLayout


class PromptKVPort:
    """Reads and writes positions 0..L−1 of a request's blocks, target layers first (docs/design.md §3)."""

    def __init__(self, kv: KVCache, num_target_layers: int):
        self.kv = kv
        self.num_target_layers = num_target_layers
        tails = tuple(tuple(t) for t in kv.layer_tails)
        self.layout = KVLayout(tails[:num_target_layers], tails[num_target_layers:], kv.dtype)

    def read_prompt_kv(self, block_ids: Sequence[int],
                       num_tokens: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(target layers, MTP layers), each array [L, *tail], copied out of the cache."""
        blocks, offsets = self._locate(block_ids, num_tokens)
        arrays = [self.kv.read(i, blocks, offsets).numpy() for i in range(len(self.kv.layers))]
        return arrays[:self.num_target_layers], arrays[self.num_target_layers:]

    def write_prompt_kv(self, block_ids: Sequence[int], kv_target: Sequence[np.ndarray],
                        kv_mtp: Sequence[np.ndarray]) -> None:
        """Store the hand-off's arrays [L, *tail] at positions 0..L−1 of `block_ids`, every layer."""
        arrays = [*kv_target, *kv_mtp]
        if len(arrays) != len(self.kv.layers):
            raise ValueError(f"PromptKVPort.write_prompt_kv: {len(arrays)} KV arrays for a cache of "
                             f"{len(self.kv.layers)} layers")
        blocks, offsets = self._locate(block_ids, int(arrays[0].shape[0]))
        for i, array in enumerate(arrays):
            self.kv.write(i, blocks, offsets, paddle.to_tensor(np.array(array)))

    def _locate(self, block_ids: Sequence[int], num_tokens: int) -> tuple[paddle.Tensor, paddle.Tensor]:
        table = np.asarray(block_ids, np.int64)[None, :]
        return self.kv.locate(table, np.zeros(num_tokens, np.int64), np.arange(num_tokens, dtype=np.int64))
