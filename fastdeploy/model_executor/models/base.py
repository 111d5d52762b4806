"""The model interface the model runner codes against (docs/design.md §3): one packed batch in, logits out."""
from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
import paddle

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.models.tokenizer import Tokenizer


@dataclass(slots=True)
class ForwardBatch:
    """One forward pass, built by the model runner. Tokens of sequence i are [seq_starts[i], seq_starts[i+1])."""

    token_ids: np.ndarray     # [N] int64, the step's tokens packed sequence after sequence
    positions: np.ndarray     # [N] int64, absolute position of each token in its sequence
    seq_starts: np.ndarray    # [S+1] int64, monotone, seq_starts[0] = 0, seq_starts[S] = N
    block_tables: np.ndarray  # [S, NB] int32, KV block ids of each sequence (-1 = none)

    def __post_init__(self):
        self.token_ids = np.asarray(self.token_ids, dtype=np.int64)
        self.positions = np.asarray(self.positions, dtype=np.int64)
        self.seq_starts = np.asarray(self.seq_starts, dtype=np.int64)
        self.block_tables = np.asarray(self.block_tables, dtype=np.int32)
        n = self.token_ids.shape[0]
        if self.token_ids.ndim != 1:
            raise ValueError(f"ForwardBatch: field 'token_ids' must be [N], got shape {self.token_ids.shape}")
        if self.positions.shape != (n,):
            raise ValueError(f"ForwardBatch: field 'positions' must be [{n}], got shape {self.positions.shape}")
        starts = self.seq_starts
        if starts.ndim != 1 or starts.size < 1 or starts[0] != 0 or starts[-1] != n or np.any(np.diff(starts) < 0):
            raise ValueError(f"ForwardBatch: field 'seq_starts' must be monotone from 0 to {n}, got {starts.tolist()}")
        if self.block_tables.ndim != 2 or self.block_tables.shape[0] != starts.size - 1:
            raise ValueError(f"ForwardBatch: field 'block_tables' must be [{starts.size - 1}, NB], "
                             f"got shape {self.block_tables.shape}")
        if n and self.positions.min() < 0:
            raise ValueError("ForwardBatch: field 'positions' has negative entries")

    @classmethod
    def unchecked(cls, token_ids: np.ndarray, positions: np.ndarray, seq_starts: np.ndarray,
                  block_tables: np.ndarray) -> ForwardBatch:
        """A batch of arrays already typed and consistent as __post_init__ checks (the runner's packing and the
        MTP proposer's sub-steps, built by array operations each step: the checks would cost as much as the
        packing; tests/engine/test_vectorized_step.py passes their batches through the checking constructor)."""
        batch = cls.__new__(cls)
        batch.token_ids, batch.positions, batch.seq_starts, batch.block_tables = \
            token_ids, positions, seq_starts, block_tables
        return batch

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_starts.shape[0] - 1)

    def seq_index(self) -> np.ndarray:
        """[N] int64: the sequence (row of block_tables) each packed token belongs to."""
        return np.repeat(np.arange(self.num_seqs, dtype=np.int64), np.diff(self.seq_starts))


def take_rows(x: paddle.Tensor, rows: np.ndarray | None) -> paddle.Tensor:
    """x [N, ...] -> x[rows] (None: x itself). A run of consecutive rows (a prefill's last row, any batch-1 step)
    is sliced: the same values as the gather, without uploading an index tensor."""
    if rows is None:
        return x
    rows = np.ascontiguousarray(rows, np.int64)
    if rows.size and np.array_equal(rows, np.arange(rows[0], rows[0] + rows.size)):
        return x[int(rows[0]):int(rows[0]) + rows.size]
    # on the host the index is the array's own memory (no copy; the gather reads it before returning)
    index = paddle.from_dlpack(rows) if rows.flags.writeable and x.place.is_cpu_place() else paddle.to_tensor(rows)
    return paddle.gather(x, index)


class Model(abc.ABC):
    """A decoder-only target model and its MTP module, if it has one (num_mtp_layers 0: none, and mtp_forward
    refuses), all reading and writing a paged KVCache.

    Subclasses set the attributes below in __init__. A model keeps no per-request state: everything it knows
    about a sequence's past is read back from the cache blocks of that sequence.
    """

    name: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    hidden_size: int
    dtype: str
    num_target_layers: int
    num_mtp_layers: int
    tokenizer: Tokenizer

    @abc.abstractmethod
    def kv_layer_tails(self) -> list[tuple[int, ...]]:
        """Trailing dims of each cache layer: target layers first, then MTP layers."""

    @abc.abstractmethod
    def forward(self, batch: ForwardBatch, kv: KVCache,
                rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        """Target pass: writes the target layers' KV of every packed token, then returns logits [R, V] of the
        packed `rows` in that order (prediction of the token at position + 1; None: every row, R = N) and hidden
        [N, H] of every row. The runner asks only for the rows that choose tokens: the head is skipped on the rest
        of a prompt, where its product with a large vocabulary is a fifth of a prefill's cost."""

    @abc.abstractmethod
    def mtp_forward(self, batch: ForwardBatch, prev_hidden: paddle.Tensor, kv: KVCache,
                    rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        """MTP pass: the input at position p is (prev_hidden [N, H] at p, batch.token_ids = token at p + 1);
        writes the MTP layers' KV, returns logits [R, V] of the packed `rows` (None: every row) predicting the
        token at p + 2 and the MTP hidden [N, H] of every row (fed back as prev_hidden to draft further ahead)."""

    def weight_bytes(self) -> int:
        """Bytes of the model's weights as stored (0 for a model without any; layers/transformer.py)."""
        from fastdeploy.model_executor.layers.transformer import stored_weight_bytes
        net = getattr(self, "net", None)
        return 0 if net is None else stored_weight_bytes(net)

    def new_kv_cache(self, num_blocks: int, block_size: int, place=None, dtype: str | None = None) -> KVCache:
        """An empty cache with this model's layer layout, on `place` (None: Paddle's current device), storing
        `dtype` (None: the model's; "bfloat16": FDConfig.kv_dtype) and read back in the model's dtype."""
        return KVCache(num_blocks, block_size, self.kv_layer_tails(), dtype or self.dtype, place, self.dtype)

    def check_kv(self, kv: KVCache) -> None:
        """Raise ValueError when `kv` was not laid out for this model."""
        if kv.layer_tails != self.kv_layer_tails() or kv.compute_dtype != self.dtype:
            raise ValueError(f"{self.name}: argument 'kv' has layers {kv.layer_tails} / {kv.compute_dtype}, "
                             f"expected {self.kv_layer_tails()} / {self.dtype}")
