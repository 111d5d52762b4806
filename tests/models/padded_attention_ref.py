"""Reference for the attention tests and benchmarks/attention_step.py: the padded attention, every sequence of a
pass padded to the pass's longest query and longest context for one batched matmul.

This is the algorithm layers/paged_attention.py ran before it grouped sequences, kept on the test side: the grouped
attention must equal it bit for bit on every group it forms (docs/design.md §3). It reads the context the way the
grouped attention does (head-major, KVCache.read_vectors), so the two differ only in how they pad.
"""
from __future__ import annotations

import numpy as np
import paddle

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.paged_attention import context_vectors
from fastdeploy.model_executor.layers.transformer import attention_core, heads_first, heads_last, mask_bias
from fastdeploy.model_executor.models.base import ForwardBatch
from fastdeploy.model_executor.models.fd_tiny import FdTiny


class PaddedPagedAttention:
    """An `attend` callable for one forward pass (see layers/transformer.py). Cache layer tail: (2, nh, hd)."""

    def __init__(self, kv: KVCache, token_seq: np.ndarray, positions: np.ndarray, seq_starts: np.ndarray,
                 block_tables: np.ndarray):
        # token_seq, positions: [N]; seq_starts: [S+1]; block_tables: [S, NB]
        self.kv = kv
        self.write_rows = kv.locate_rows(block_tables, token_seq, positions)
        counts = np.diff(seq_starts)
        active = np.flatnonzero(counts > 0)              # sequences with tokens in this pass
        rank = np.full(counts.size, -1, np.int64)
        rank[active] = np.arange(active.size)
        self.num_active = active.size
        self.max_q = int(counts.max()) if counts.size else 0
        # last position + 1 of each active sequence; inactive sequences are empty, so the active starts delimit it
        ctx_len = (np.maximum.reduceat(positions, seq_starts[active]) + 1 if active.size
                   else np.zeros(0, np.int64))
        self.max_ctx = int(ctx_len.max()) if ctx_len.size else 0
        # padded query slot of each packed token: row rank[seq], column = index within the sequence
        col = np.arange(positions.size) - seq_starts[token_seq]
        pad_index = rank[token_seq] * self.max_q + col
        # when every active sequence has max_q tokens the packed rows already are the padded rows, in order
        # (always so at batch 1): the scatter into the padding and the gather back would be exact copies
        self.pad_index = (None if pad_index.size == active.size * self.max_q
                          and np.array_equal(pad_index, np.arange(pad_index.size)) else paddle.to_tensor(pad_index))
        # context rows: positions 0..max_ctx-1 of every active sequence; padding repeats position 0 (masked out)
        ctx_pos = np.tile(np.arange(self.max_ctx, dtype=np.int64), (active.size, 1))
        ctx_pos = np.where(ctx_pos < ctx_len[:, None], ctx_pos, 0)
        self.nh = kv.layer_tails[0][1]
        self.k_vectors, self.v_vectors = context_vectors(
            kv.row_ids(block_tables, np.repeat(active, self.max_ctx), ctx_pos.reshape(-1)), self.nh)
        q_pos = np.zeros((active.size, self.max_q), np.int64)  # padded query rows attend to position 0 only
        q_pos.reshape(-1)[pad_index] = positions
        mask = (np.arange(self.max_ctx)[None, None, None, :] <= q_pos[None, :, :, None])  # [1, S', Tq, C]
        self.bias = mask_bias(np.broadcast_to(mask, (self.nh, *mask.shape[1:])), kv.dtype)

    def __call__(self, layer: int, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
        # q, k, v: [N, nh, hd] -> [N, nh, hd]
        n, nh, hd = q.shape
        self.kv.write_rows(layer, self.write_rows, paddle.stack([k, v], axis=1))
        k_ctx, v_ctx = (self.kv.read_vectors(layer, vectors).reshape([nh, self.num_active, self.max_ctx, hd])
                        for vectors in (self.k_vectors, self.v_vectors))
        if self.pad_index is not None:
            q = paddle.scatter(paddle.zeros([self.num_active * self.max_q, nh, hd], dtype=q.dtype), self.pad_index,
                               q, overwrite=True)
        out = heads_last(attention_core(heads_first(q.reshape([self.num_active, self.max_q, nh, hd])), k_ctx, v_ctx,
                                        self.bias))
        return out if self.pad_index is None else paddle.gather(out, self.pad_index)


class PaddedFdTiny(FdTiny):
    """fd-tiny sharing another FdTiny's parameters, attending with PaddedPagedAttention (the reference pass)."""

    def __init__(self, model: FdTiny):
        super().__init__(model.net, model.dtype)

    @staticmethod
    def _attend(batch: ForwardBatch, kv: KVCache) -> PaddedPagedAttention:
        return PaddedPagedAttention(kv, batch.seq_index(), batch.positions, batch.seq_starts, batch.block_tables)
