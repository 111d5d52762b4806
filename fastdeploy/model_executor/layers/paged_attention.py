"""Attention of a packed batch over a paged KV cache: write this step's K/V, read each sequence back, attend.

Each packed token at position p attends to positions 0..p of its own sequence, all read from the cache blocks
named by the sequence's block table (nothing is taken from the batch directly), so a lost or misplaced block
changes the result. Sequences are padded to a common query and context length for one batched matmul.
"""
from __future__ import annotations

import numpy as np
import paddle

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.transformer import attention_core


class PagedAttention:
    """An `attend` callable for one forward pass (see layers/transformer.py). Cache layer tail: (2, nh, hd)."""

    def __init__(self, kv: KVCache, token_seq: np.ndarray, positions: np.ndarray, seq_starts: np.ndarray,
                 block_tables: np.ndarray):
        # token_seq, positions: [N]; seq_starts: [S+1]; block_tables: [S, NB]
        self.kv = kv
        self.write_at = kv.locate(block_tables, token_seq, positions)
        counts = np.diff(seq_starts)
        active = np.flatnonzero(counts > 0)              # sequences with tokens in this pass
        rank = np.full(counts.size, -1, np.int64)
        rank[active] = np.arange(active.size)
        self.num_active = active.size
        self.max_q = int(counts.max()) if counts.size else 0
        ctx_len = np.array([positions[seq_starts[s]:seq_starts[s + 1]].max() + 1 for s in active], np.int64)
        self.max_ctx = int(ctx_len.max()) if ctx_len.size else 0
        # padded query slot of each packed token: row rank[seq], column = index within the sequence
        col = np.arange(positions.size) - seq_starts[token_seq]
        self.pad_index = paddle.to_tensor(rank[token_seq] * self.max_q + col)
        # context rows: positions 0..max_ctx-1 of every active sequence; padding repeats position 0 (masked out)
        ctx_pos = np.tile(np.arange(self.max_ctx, dtype=np.int64), (active.size, 1))
        ctx_pos = np.where(ctx_pos < ctx_len[:, None], ctx_pos, 0)
        self.read_at = kv.locate(block_tables, np.repeat(active, self.max_ctx), ctx_pos.reshape(-1))
        q_pos = np.zeros((active.size, self.max_q), np.int64)  # padded query rows attend to position 0 only
        q_pos.reshape(-1)[rank[token_seq] * self.max_q + col] = positions
        mask = (np.arange(self.max_ctx)[None, None, :] <= q_pos[:, :, None])  # [S', Tq, C]
        self.mask = paddle.to_tensor(mask)

    def __call__(self, layer: int, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
        # q, k, v: [N, nh, hd] -> [N, nh, hd]
        n, nh, hd = q.shape
        self.kv.write(layer, *self.write_at, paddle.stack([k, v], axis=1))
        ctx = self.kv.read(layer, *self.read_at).reshape([self.num_active, self.max_ctx, 2, nh, hd])
        q_pad = paddle.zeros([self.num_active * self.max_q, nh, hd], dtype=q.dtype)
        q_pad = paddle.scatter(q_pad, self.pad_index, q, overwrite=True)
        out = attention_core(q_pad.reshape([self.num_active, self.max_q, nh, hd]), ctx[:, :, 0], ctx[:, :, 1],
                             self.mask)
        return paddle.gather(out.reshape([self.num_active * self.max_q, nh, hd]), self.pad_index)
