"""Gathering a prompt's KV from P's blocks and scattering it into D's (PD_MTP_FLOW §3 rows "Target/MTP KV")."""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.splitwise import gather_prompt_kv, prompt_kv_positions, scatter_prompt_kv

BLOCK_SIZE = 4
TAIL = (2, 3)


def _cache(rng, num_blocks=8, dtype=np.float32):
    return rng.standard_normal((num_blocks, BLOCK_SIZE, *TAIL)).astype(dtype)


@pytest.mark.parametrize("num_tokens", [1, 3, 4, 5, 8, 11])
def test_gather_then_scatter_moves_exactly_the_prompt_positions(num_tokens):
    """D's blocks hold P's KV for positions 0..L-1, bit for bit, under different block ids; nothing else changes."""
    rng = np.random.default_rng(num_tokens)
    p_cache, d_cache = _cache(rng), _cache(rng)
    p_blocks, d_blocks = [5, 1, 6], [2, 7, 0, 3]  # D preallocated one lookahead block more (§5.1)
    d_before = d_cache.copy()
    payload = gather_prompt_kv(p_cache, p_blocks, num_tokens)
    assert payload.shape == (num_tokens, *TAIL)
    scatter_prompt_kv(payload, d_cache, d_blocks)
    assert gather_prompt_kv(d_cache, d_blocks, num_tokens).tobytes() == payload.tobytes()
    for p in range(num_tokens):
        assert d_cache[d_blocks[p // BLOCK_SIZE], p % BLOCK_SIZE].tobytes() == \
            p_cache[p_blocks[p // BLOCK_SIZE], p % BLOCK_SIZE].tobytes()
    written = np.zeros(d_cache.shape[:2], dtype=bool)
    blocks, offsets = prompt_kv_positions(d_blocks, num_tokens, BLOCK_SIZE, d_cache.shape[0])
    written[blocks, offsets] = True
    assert np.array_equal(d_cache[~written], d_before[~written])


def test_positions_follow_the_block_table():
    """Position p lives at (block_ids[p // block_size], p % block_size) (docs/design.md §3)."""
    blocks, offsets = prompt_kv_positions([3, 0, 2], 9, 4, 4)
    assert blocks.tolist() == [3, 3, 3, 3, 0, 0, 0, 0, 2]
    assert offsets.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0]


@pytest.mark.parametrize("block_ids,num_tokens,fragment", [
    ([1], 5, "has 1 blocks; 5 tokens at block size 4 need 2"),
    ([1, -1], 5, r"ids in \[0, 8\) for its first 2 blocks \(got \[1, -1\]\)"),
    ([1, 8], 5, r"ids in \[0, 8\)"),
])
def test_missing_or_foreign_block_is_an_error(block_ids, num_tokens, fragment):
    """Writing a prompt position with no block of the request would clobber another request's KV: refuse it."""
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=fragment):
        gather_prompt_kv(_cache(rng), block_ids, num_tokens)


def test_scatter_refuses_a_payload_of_another_layout():
    """No silent casts or reshapes into D's cache: dtype and per-token shape must match the layer."""
    rng = np.random.default_rng(1)
    cache = _cache(rng)
    with pytest.raises(ValueError, match=r"'kv' must be float32\[L, 2, 3\] .*got float64\[4, 2, 3\]"):
        scatter_prompt_kv(np.zeros((4, *TAIL)), cache, [0])
    with pytest.raises(ValueError, match=r"got float32\[4, 3, 2\]"):
        scatter_prompt_kv(np.zeros((4, 3, 2), dtype=np.float32), cache, [0])
    with pytest.raises(ValueError, match="'layer' is read-only"):
        cache.flags.writeable = False
        scatter_prompt_kv(np.zeros((4, *TAIL), dtype=np.float32), cache, [0])
