"""Copying a prompt's KV between a paged cache layer and the hand-off's dense per-layer array (PD_MTP_FLOW §3).

The hand-off carries positions 0..L−1 of each layer as one `[L, *tail]` array, so P and D need not share block
ids. P gathers from its blocks; D scatters into the blocks it preallocated. Position p lives at
`(block_ids[p // block_size], p % block_size)`, the layout of docs/design.md §3. NumPy only: the caller converts
framework tensors (the index arrays of `prompt_kv_positions` also work as advanced indices on a Paddle tensor).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def prompt_kv_positions(
    block_ids: Sequence[int] | np.ndarray,  # [NB] the request's blocks in order; -1 = unallocated
    num_tokens: int,
    block_size: int,
    num_blocks: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Where positions 0..num_tokens−1 live: (block id [L] int64, offset in block [L] int64).

    Raises ValueError when a needed block is missing (−1 or too few ids) or outside the cache's `num_blocks`.
    """
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"prompt_kv_positions: argument 'num_tokens' must be an int >= 0 (got {num_tokens!r})")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"prompt_kv_positions: argument 'block_size' must be an int >= 1 (got {block_size!r})")
    ids = np.asarray(block_ids, dtype=np.int64).reshape(-1)
    needed = -(-num_tokens // block_size)
    if ids.size < needed:
        raise ValueError(f"prompt_kv_positions: argument 'block_ids' has {ids.size} blocks; {num_tokens} tokens "
                         f"at block size {block_size} need {needed}")
    used = ids[:needed]
    if np.any(used < 0) or np.any(used >= num_blocks):
        raise ValueError(f"prompt_kv_positions: argument 'block_ids' must hold ids in [0, {num_blocks}) for its "
                         f"first {needed} blocks (got {used.tolist()})")
    positions = np.arange(num_tokens, dtype=np.int64)
    return used[positions // block_size], positions % block_size


def gather_prompt_kv(
    layer: np.ndarray,  # [num_blocks, block_size, *tail] one cache layer
    block_ids: Sequence[int] | np.ndarray,  # [NB] the request's blocks
    num_tokens: int,  # L
) -> np.ndarray:
    """P side: a new `[L, *tail]` array with the layer's KV at positions 0..L−1."""
    _check_layer("gather_prompt_kv", layer)
    blocks, offsets = prompt_kv_positions(block_ids, num_tokens, layer.shape[1], layer.shape[0])
    return layer[blocks, offsets]


def scatter_prompt_kv(
    kv: np.ndarray,  # [L, *tail] from the hand-off
    layer: np.ndarray,  # [num_blocks, block_size, *tail] one cache layer, written in place
    block_ids: Sequence[int] | np.ndarray,  # [NB] D's preallocated blocks for the request
) -> None:
    """D side: write positions 0..L−1 of `kv` into the request's blocks of `layer`; nothing else changes."""
    _check_layer("scatter_prompt_kv", layer)
    if not isinstance(kv, np.ndarray) or kv.ndim < 1 or kv.shape[1:] != layer.shape[2:] or kv.dtype != layer.dtype:
        got = f"{kv.dtype}{list(kv.shape)}" if isinstance(kv, np.ndarray) else type(kv).__name__
        tail = ", ".join(map(str, layer.shape[2:]))
        raise ValueError(f"scatter_prompt_kv: argument 'kv' must be {layer.dtype}[L, {tail}] to match the cache "
                         f"layer (got {got})")
    blocks, offsets = prompt_kv_positions(block_ids, kv.shape[0], layer.shape[1], layer.shape[0])
    if not layer.flags.writeable:
        raise ValueError("scatter_prompt_kv: argument 'layer' is read-only")
    layer[blocks, offsets] = kv


def _check_layer(op: str, layer: object) -> None:
    if not isinstance(layer, np.ndarray) or layer.ndim < 2:
        shape = list(layer.shape) if isinstance(layer, np.ndarray) else type(layer).__name__
        raise ValueError(f"{op}: argument 'layer' must be a numpy array [num_blocks, block_size, ...] (got {shape})")
