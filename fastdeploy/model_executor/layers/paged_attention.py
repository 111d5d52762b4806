"""Attention of a packed batch over a paged KV cache: write this step's K/V, read each sequence back, attend.

Each packed token at position p attends to positions 0..p of its own sequence, all read from the cache blocks
named by the sequence's block table (nothing is taken from the batch directly), so a lost or misplaced block
changes the result. The sequences of a pass are attended in groups (`plan_groups`): each group is padded only to
its own longest query and longest context for one batched matmul, so a decode row is never padded to the length
of a prefill chunk that shares its step, and each group's rows are bit for bit those of one padded batch of just
that group's sequences (docs/design.md §3). A prefill chunk alone in its group is attended by
transformer.chunk_attention instead, in query tiles without a mask over the whole context, so its cost is the
causal half of its query x context slots at any chunk length; on the CPU, for a float32 model, by
fused_attention.prefill_attention, which reads the cache in place (OPS §11.3), and there every prefill chunk is
alone in its group, however short: one op call a chunk pads nothing, where a padded group of short chunks cost
transposes of its queries and outputs and the rotation and cache write as separate Paddle ops.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle

from fastdeploy.config import MAX_SPECULATIVE_TOKENS
from fastdeploy.model_executor.layers import fused_attention
from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.quantization.base import CpuOperands, empty_float32
from fastdeploy.model_executor.layers.transformer import (attention_core, chunk_attention, heads_first, heads_last,
                                                         mask_bias, triangle_bias)

# A decode row queries its next token and at most K drafts; every sequence at or under this length is a decode row.
DECODE_MAX_QUERY = MAX_SPECULATIVE_TOKENS + 1
# Query x context slots that one more group's fixed work (about a dozen Paddle ops per layer) costs on the CPU
# (measured ~250 us against ~0.1 us a slot, docs/benchmarks.md "Attention without padding").
GROUP_COST_SLOTS = 2048
# Query rows of one tile of chunk_attention (per query head), and the longest chunk that may share a padded group
# with others where the CPU ops do not run: a longer one is attended alone, in tiles (measured, docs/benchmarks.md
# "Long prompts").
PREFILL_TILE = 128


def plan_groups(q_len: np.ndarray, ctx_len: np.ndarray, chunks_alone: bool = False) -> list[np.ndarray]:
    """Partition sequences into attention groups: a list of ascending index arrays into q_len / ctx_len ([S']).

    Decode rows (q_len <= DECODE_MAX_QUERY) form one group, so no decode row is padded to a prefill chunk's
    length. A chunk longer than PREFILL_TILE is a group of its own (attended in tiles). Shorter prefill chunks,
    taken by query then context length, join the previous chunk's group while that adds fewer padded slots than
    a group of their own costs (GROUP_COST_SLOTS), so many short prompts are not attended one small matmul at a
    time; with `chunks_alone` (the CPU op, which reads each chunk's context in place for one op call and pads
    nothing) every chunk is a group of its own.
    """
    is_decode = q_len <= DECODE_MAX_QUERY
    decode = np.flatnonzero(is_decode)
    groups = [decode] if decode.size else []
    if decode.size == q_len.size:              # every decode step: nothing else to plan
        return groups
    longest_shared = DECODE_MAX_QUERY if chunks_alone else PREFILL_TILE   # a longer chunk is attended alone
    alone = np.flatnonzero(q_len > longest_shared)
    chunks = np.flatnonzero(~is_decode & (q_len <= longest_shared))
    current: list[int] = []
    for i in chunks[np.lexsort((ctx_len[chunks], q_len[chunks]))]:
        joined = current + [int(i)]
        if current and _slots(q_len, ctx_len, joined) > (_slots(q_len, ctx_len, current)
                                                         + _slots(q_len, ctx_len, [i]) + GROUP_COST_SLOTS):
            groups.append(np.sort(current))
            joined = [int(i)]
        current = joined
    return groups + ([np.sort(current)] if current else []) + [alone[i:i + 1] for i in range(alone.size)]


def _slots(q_len: np.ndarray, ctx_len: np.ndarray, members: list[int]) -> int:
    """Query x context slots of one padded batch of sequences `members`."""
    return len(members) * int(q_len[members].max()) * int(ctx_len[members].max())


def context_vectors(rows: np.ndarray, num_heads: int) -> tuple[paddle.Tensor, paddle.Tensor]:
    """The KVCache.read_vectors ids of K and of V at cache rows `rows` ([M]) of a layer with tail (2, nh, hd),
    head-major ([nh * M]: head 0's rows, then head 1's, ...): entry (K or V, head) of row r is vector
    r * 2 * nh + (0 or nh) + head."""
    k_vectors = (rows[None, :] * (2 * num_heads) + np.arange(num_heads)[:, None]).reshape(-1)
    return paddle.to_tensor(k_vectors), paddle.to_tensor(k_vectors + num_heads)


@dataclass(slots=True)
class _Group:
    """One padded batch: `num` sequences, each with `q` query slots and `c` context rows; or (`past` >= 0) one
    prefill chunk, its q query slots the packed rows first_row .. first_row + q - 1 at positions past .. c - 1,
    attended by transformer.chunk_attention (by fused_attention.prefill_attention where the CPU ops are used)."""

    num: int
    q: int
    c: int
    q_index: paddle.Tensor | None   # [num * q] packed row of each query slot; None: the packed rows, in order
    k_vectors: paddle.Tensor        # [nkv * num * c] cache vectors (KVCache.read_vectors) of the context's K,
    v_vectors: paddle.Tensor        # and V, KV-head-major; padding repeats position 0 (masked)
    bias: paddle.Tensor | None      # [nkv, num, g * q, c] 0 / -inf (transformer.attention_core); None for a chunk
    past: int = -1                  # a chunk's cached positions before its queries; -1: a padded batch
    first_row: int = 0
    # the fused paths on the CPU (fused_attention), instead of k/v vectors and bias: decode rows (past -1), or a
    # prefill chunk (past >= 0; ctx_rows [c])
    ctx_rows: paddle.Tensor | None = None    # [num, c] cache rows of each sequence's positions
    token_seq: paddle.Tensor | None = None   # [num * q] int32: each query slot's sequence in the group
    token_len: paddle.Tensor | None = None   # [num * q] int32: its context length (position + 1)


class PagedAttention:
    """An `attend` callable for one forward pass (see layers/transformer.py). Cache layer tail: (2, nkv, hd), the
    same for every layer it attends over; q has `num_heads` heads (default nkv), a multiple g of nkv.

    Grouped-query attention (GQA) without copying K/V per query head: query head h = j * g + i reads KV head j
    (HF `repeat_kv` order), so the g query heads of KV head j are stacked as g * q query rows of one batched
    matmul against that head's context, read once, contiguous (docs/design.md §3)."""

    def __init__(self, kv: KVCache, token_seq: np.ndarray, positions: np.ndarray, seq_starts: np.ndarray,
                 block_tables: np.ndarray, num_heads: int | None = None):
        # token_seq, positions: [N]; seq_starts: [S+1]; block_tables: [S, NB]
        self.kv = kv
        self.tail = kv.layer_tails[0]
        if len(self.tail) != 3 or self.tail[0] != 2:
            raise ValueError(f"PagedAttention: cache layers must have tail (2, heads, head_dim), got {self.tail}")
        self.num_heads = self.tail[1] if num_heads is None else num_heads
        if self.num_heads < 1 or self.num_heads % self.tail[1]:
            raise ValueError(f"PagedAttention: argument 'num_heads' ({self.num_heads}) must be a positive multiple "
                             f"of the cache's KV heads ({self.tail[1]})")
        self.group = self.num_heads // self.tail[1]
        self.fused = fused_attention.AVAILABLE and kv.compute_dtype == "float32"
        self.write_rows = kv.locate_rows(block_tables, token_seq, positions)
        seq_starts = np.asarray(seq_starts, np.int64)
        counts = np.diff(seq_starts)
        active = np.flatnonzero(counts > 0)              # sequences with tokens in this pass
        # last position + 1 of each active sequence; inactive sequences are empty, so the active starts delimit it
        ctx_len = (np.maximum.reduceat(positions, seq_starts[active]) + 1 if active.size
                   else np.zeros(0, np.int64))
        self.groups: list[_Group] = []
        self.group_seqs: list[np.ndarray] = []           # the sequences (rows of block_tables) of each group
        slot = np.zeros(positions.size, np.int64)        # padded output slot of each packed token
        base = 0
        for members in plan_groups(counts[active], ctx_len, chunks_alone=self.fused):
            seqs = active[members]
            group, slots = self._group(block_tables, positions, seq_starts, seqs, ctx_len[members])
            slot[slots[0]] = base + slots[1]
            base += group.num * group.q
            self.groups.append(group)
            self.group_seqs.append(seqs)
        # one group whose query slots are the packed rows in order (every decode step at batch 1, every pass of
        # one prefill chunk): no gather in, no gather out
        single = (len(self.groups) == 1 and self.groups[0].q_index is None
                  and (self.groups[0].past < 0 or self.groups[0].q == positions.size))
        self._triangles: dict[int, paddle.Tensor] = {}   # chunk_attention's biases by tile rows, for every layer
        self.out_index = None if single or not self.groups else paddle.to_tensor(slot)
        # every group is read from the cache in place by the CPU ops (decode and verify rows, a lone prefill
        # chunk): attend_qkv may be used
        self.fuses_rope = bool(self.groups) and all(g.ctx_rows is not None for g in self.groups)
        # the whole pass is decode / verify rows, in order, read in place: a layer's attention half may be one op
        # (attention_block)
        self.runs_blocks = self.fuses_rope and single and self.groups[0].past < 0

    def _group(self, block_tables: np.ndarray, positions: np.ndarray, seq_starts: np.ndarray,
               seqs: np.ndarray, ctx_len: np.ndarray) -> tuple[_Group, tuple[np.ndarray, np.ndarray]]:
        """The padded batch of sequences `seqs` (ascending), or their lone prefill chunk, and, for its packed
        tokens, (token rows, slots)."""
        counts = seq_starts[seqs + 1] - seq_starts[seqs]
        num, q, c = seqs.size, int(counts.max()), int(ctx_len.max())
        col = np.arange(q, dtype=np.int64)[None, :]
        real = col < counts[:, None]                                          # [num, q]
        # a padding slot repeats the sequence's first token; its output is never read back
        token_row = seq_starts[seqs][:, None] + np.where(real, col, 0)        # [num, q]
        q_pos = np.where(real, positions[token_row], 0)                       # padding attends to position 0 only
        slots = np.flatnonzero(real)
        rows = token_row.reshape(-1)
        contiguous = rows.size == positions.size and np.array_equal(rows, np.arange(rows.size))
        ctx_pos = np.arange(c, dtype=np.int64)[None, :]
        ctx_pos = np.where(ctx_pos < ctx_len[:, None], ctx_pos, 0)                # [num, c]
        nkv, g = self.tail[1], self.group
        ctx_rows = self.kv.row_ids(block_tables, np.repeat(seqs, c), ctx_pos.reshape(-1))
        q_index = None if contiguous else paddle.to_tensor(rows)
        if self.fused and q <= DECODE_MAX_QUERY:   # decode / verify rows: the cache read in place, no mask
            group = _Group(num, q, c, q_index, None, None, None,
                           ctx_rows=paddle.to_tensor(ctx_rows.reshape(num, c)),
                           token_seq=paddle.to_tensor(np.repeat(np.arange(num, dtype=np.int32), q)),
                           token_len=paddle.to_tensor((q_pos.reshape(-1) + 1).astype(np.int32)))
            return group, (token_row.reshape(-1)[slots], slots)
        past = c - q
        if num == 1 and q > DECODE_MAX_QUERY and np.array_equal(q_pos[0], np.arange(past, c)):
            # a lone prefill chunk: its queries are the context's last q positions, on consecutive packed rows
            if self.fused:   # the cache read in place, keys in blocks with a running softmax
                group = _Group(1, q, c, None, None, None, None, past, int(token_row[0, 0]),
                               ctx_rows=paddle.to_tensor(ctx_rows))
            else:
                group = _Group(1, q, c, None, *context_vectors(ctx_rows, nkv), None, past, int(token_row[0, 0]))
            return group, (token_row.reshape(-1), slots)
        k_vectors, v_vectors = context_vectors(ctx_rows, nkv)
        if g > 1:   # query rows (i, t) of KV head j: query head j * g + i at slot t
            q_pos = np.tile(q_pos[:, None, :], (1, g, 1)).reshape(num, g * q)
        mask = np.arange(c)[None, None, None, :] <= q_pos[None, :, :, None]    # [1, num, g * q, c]
        group = _Group(num, q, c, q_index, k_vectors, v_vectors,
                       mask_bias(np.broadcast_to(mask, (nkv, num, g * q, c)), self.kv.compute_dtype))
        return group, (token_row.reshape(-1)[slots], slots)

    def __call__(self, layer: int, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
        # q [N, nh, hd], k, v: [N, nkv, hd] -> [N, nh, hd]
        self._check_tail(layer)
        self.kv.write_rows(layer, self.write_rows, paddle.stack([k, v], axis=1))
        return self._attend_groups(layer, q)

    def attend_qkv(self, layer: int, qkv: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor,
                   interleaved: bool) -> paddle.Tensor:
        """As __call__, from the unrotated q | k | v heads [N, (nh + 2 nkv) * hd] and the rotation's spread tables
        (layers/rotary.py): the rotation and the cache write in one op (fused_attention.rope_cache_write), the
        same bits as rotating, then calling this object. Only where fuses_rope."""
        self._check_tail(layer)
        if not self.kv.layers[layer].is_contiguous():
            raise ValueError(f"PagedAttention: cache layer {layer} is not contiguous; the op writes its storage")
        q = fused_attention.rope_cache_write(qkv, cos, sin, self.kv.layers[layer], self.write_rows, self.num_heads,
                                             interleaved)
        return self._attend_groups(layer, q)

    def attention_block(self, layer: int, x: paddle.Tensor, residual: paddle.Tensor | None, norm_weight: paddle.Tensor,
                        eps: float, qkv: CpuOperands, o_proj: CpuOperands, cos: paddle.Tensor, sin: paddle.Tensor,
                        interleaved: bool) -> tuple[paddle.Tensor, paddle.Tensor]:
        """The attention half of decoder layer `layer` in one op (fused_attention.attention_block, OPS §13.3): (the
        o_proj product of the attention of norm(x + residual)'s q|k|v, x + residual), where runs_blocks; the same
        bits, and the same cache writes, as the norm, the q|k|v product, attend_qkv and the o_proj product."""
        self._check_tail(layer)
        if not self.kv.layers[layer].is_contiguous():
            raise ValueError(f"PagedAttention: cache layer {layer} is not contiguous; the op writes its storage")
        g = self.groups[0]
        return fused_attention.attention_block(
            x, empty_float32() if residual is None else residual, norm_weight, eps, qkv, o_proj, cos, sin,
            self.kv.layers[layer], self.write_rows, g.ctx_rows, g.token_seq, g.token_len, self.num_heads,
            interleaved, 1.0 / np.sqrt(self.tail[2]))

    def decoder_stack(self, x: paddle.Tensor, ops, cos: paddle.Tensor,
                      sin: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """x [M, H] through the decoder layers 0 .. L - 1 whose operands are `ops` (layers/decoder.StackOperands),
        in one op (fused_attention.decoder_stack, OPS §13.4), where runs_blocks: the last layer's (out, residual),
        the same bits and cache writes as each layer's attention_block and MLP op in turn. The op refuses a cache
        layer of another shape than the weights' heads, or one that is not contiguous (it writes it in place)."""
        g = self.groups[0]
        return fused_attention.decoder_stack(x, ops, cos, sin, self.kv.layers[:len(ops.lists[0])], self.write_rows,
                                             g.ctx_rows, g.token_seq, g.token_len, self.num_heads,
                                             1.0 / np.sqrt(self.tail[2]))

    def _check_tail(self, layer: int) -> None:
        if self.kv.layer_tails[layer] != self.tail:
            raise ValueError(f"PagedAttention: layer {layer} has tail {self.kv.layer_tails[layer]}, the pass was "
                             f"planned for {self.tail}")

    def _attend_groups(self, layer: int, q: paddle.Tensor) -> paddle.Tensor:
        if not self.groups:
            return q
        outs = [self._attend(layer, g, q) for g in self.groups]
        out = outs[0] if len(outs) == 1 else paddle.concat(outs)
        return out if self.out_index is None else paddle.gather(out, self.out_index)

    def _attend(self, layer: int, g: _Group, q: paddle.Tensor) -> paddle.Tensor:
        """Attention of one group: [g.num * g.q, nh, hd], query slot order."""
        _, nkv, hd = self.tail
        if g.ctx_rows is not None and g.past >= 0:
            return fused_attention.prefill_attention(q[g.first_row:g.first_row + g.q], self.kv.layers[layer],
                                                     g.ctx_rows, 1.0 / np.sqrt(hd))
        if g.ctx_rows is not None:
            if g.q_index is not None:
                q = paddle.gather(q, g.q_index)
            return fused_attention.decode_attention(q, self.kv.layers[layer], g.ctx_rows, g.token_seq, g.token_len,
                                                    1.0 / np.sqrt(hd))
        k = self.kv.read_vectors(layer, g.k_vectors).reshape([nkv, g.num, g.c, hd])
        v = self.kv.read_vectors(layer, g.v_vectors).reshape([nkv, g.num, g.c, hd])
        if g.past >= 0:
            return chunk_attention(q[g.first_row:g.first_row + g.q], k.reshape([nkv, g.c, hd]),
                                   v.reshape([nkv, g.c, hd]), g.past, PREFILL_TILE, self._triangle)
        if g.q_index is not None:
            q = paddle.gather(q, g.q_index)
        if self.group == 1:
            return heads_last(attention_core(heads_first(q.reshape([g.num, g.q, nkv, hd])), k, v, g.bias))
        n, t, gs = g.num, g.q, self.group
        # [n, t, nkv, gs, hd] -> [nkv, n, gs * t, hd]: a copy of the (small) queries, the context stays in place
        qg = q.reshape([n, t, nkv, gs, hd]).transpose([2, 0, 3, 1, 4]).reshape([nkv, n, gs * t, hd])
        out = attention_core(qg, k, v, g.bias).reshape([nkv, n, gs, t, hd])
        return out.transpose([1, 3, 0, 2, 4]).reshape([n * t, nkv * gs, hd])

    def _triangle(self, n: int) -> paddle.Tensor:
        """transformer.triangle_bias of an n-row tile, built once per pass."""
        if n not in self._triangles:
            self._triangles[n] = triangle_bias(self.tail[1], self.group, n, self.kv.compute_dtype)
        return self._triangles[n]
