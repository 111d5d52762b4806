"""Paged KV storage: one tensor per model layer, addressed by (block id, offset in block).

The engine owns block ids (allocation, freeing, block tables); this class only stores values and moves them.
Layer order follows docs/design.md §3: the target model's layers first, then the MTP module's layers.

A bfloat16 cache (docs/models.md "Precision") stores each value rounded to bf16 (Paddle's cast: nearest even) and
widens what the attention reads (`read_vectors`) to `compute_dtype`, the activations' dtype: Paddle's CPU matmul
has no bf16. In host memory it is NumPy's zeros of int16 seen by Paddle as bfloat16 (NumPy has no bfloat16;
Paddle has no kernels for a uint16 tensor); its host views are uint16, the bits (precision.kv_storage_dtype).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import paddle

from fastdeploy.precision import KV_CACHE_DTYPES, kv_storage_dtype


class KVCache:
    """`layers[i]` has shape [num_blocks, block_size, *layer_tails[i]] and dtype `dtype`, on `place`;
    `compute_dtype` is what `read_vectors` returns (None: `dtype`, float32 for a bfloat16 cache)."""

    def __init__(self, num_blocks: int, block_size: int, layer_tails: Sequence[tuple[int, ...]],
                 dtype: str = "float32", place=None, compute_dtype: str | None = None):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"KVCache: argument 'num_blocks' must be a positive int, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"KVCache: argument 'block_size' must be a positive int, got {block_size!r}")
        if dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"KVCache: argument 'dtype' must be one of {KV_CACHE_DTYPES}, got {dtype!r}")
        compute_dtype = compute_dtype or ("float32" if dtype == "bfloat16" else dtype)
        if compute_dtype not in ("float32", "float64"):
            raise ValueError(f"KVCache: argument 'compute_dtype' must be float32 or float64, got {compute_dtype!r}")
        tails = [tuple(int(d) for d in tail) for tail in layer_tails]
        if not tails or any(d < 1 for tail in tails for d in tail):
            raise ValueError(f"KVCache: argument 'layer_tails' must be a non-empty list of positive dims, "
                             f"got {layer_tails!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.compute_dtype = compute_dtype
        self.layer_tails = tails
        # place None: Paddle's current device (the host in the CPU build); a device place puts every layer there.
        self.layers: list[paddle.Tensor] = [self._zeros([num_blocks, block_size, *tail], dtype, place)
                                            for tail in tails]
        self._host_views: list[tuple[paddle.Tensor, np.ndarray] | None] | None = None

    @staticmethod
    def _zeros(shape: list[int], dtype: str, place) -> paddle.Tensor:
        """A zero layer. In host memory it is NumPy's (calloc: the kernel maps zero pages, so a block costs
        resident memory only once written) shared with Paddle through DLPack; `paddle.zeros` would write every
        byte at start, making the whole budget resident however little of it is used. A bfloat16 layer is an int16
        one viewed as bfloat16 (the same memory)."""
        held = np.int16 if dtype == "bfloat16" else dtype
        if place is not None:
            tensor = paddle.to_tensor(np.zeros(shape, dtype=held), place=place)
            return tensor.view("bfloat16") if dtype == "bfloat16" else tensor
        if not paddle.get_device().startswith("cpu"):
            return paddle.zeros(shape, dtype=dtype)
        tensor = paddle.utils.dlpack.from_dlpack(np.zeros(shape, dtype=held))   # the capsule keeps the array
        if not tensor.place.is_cpu_place():   # not shared after all: Paddle's own
            return paddle.zeros(shape, dtype=dtype)
        return tensor.view("bfloat16") if dtype == "bfloat16" else tensor

    # ---- the memory itself, for the P→D hand-off (worker/kv_transfer.py) ----

    def host_view(self, layer: int) -> np.ndarray | None:
        """Layer `layer` as a writable NumPy array [num_blocks, block_size, *tail] sharing the cache's memory (no
        copy: DLPack; in Paddle 3.3.1 `Tensor.numpy()` copies, `np.from_dlpack` shares), or None when the layer is
        not in host memory (a device cache). Its dtype is precision.kv_storage_dtype(dtype): uint16 bits for bf16.
        Every write of this class is in place, so the view stays valid while `layers[layer]` is the same tensor."""
        if self._host_views is None:
            self._host_views = [None] * len(self.layers)
        tensor, cached = self.layers[layer], self._host_views[layer]
        if cached is not None and cached[0] is tensor:
            return cached[1]
        if not tensor.place.is_cpu_place() or not tensor.is_contiguous():
            return None
        held = kv_storage_dtype(self.dtype)
        view = np.from_dlpack(tensor.view("int16")).view(held) if self.dtype == "bfloat16" else np.from_dlpack(tensor)
        if view.dtype != held or view.ctypes.data != tensor.data_ptr() or not view.flags.writeable:
            return None   # not a view of the cache after all: the caller falls back to copying through Paddle
        self._host_views[layer] = (tensor, view)
        return view

    def memory_regions(self) -> list[tuple[int, int]] | None:
        """(address, bytes) of each layer's memory, for a transfer engine to register; None for a device cache."""
        views = [self.host_view(i) for i in range(len(self.layers))]
        if any(v is None for v in views):
            return None
        return [(v.ctypes.data, v.nbytes) for v in views]

    def locate(self, block_tables: np.ndarray, seq_index: np.ndarray,
               positions: np.ndarray) -> tuple[paddle.Tensor, paddle.Tensor]:
        """(block id, offset) of each position through its sequence's block table.

        block_tables: [S, NB] int; seq_index: [M] row of block_tables for each position; positions: [M].
        Returns two int64 tensors [M]. Raises ValueError when a position has no block (-1, beyond the table or
        outside the cache): reading or writing there would silently use another request's KV.
        """
        blocks, offsets = self._locate(block_tables, seq_index, positions)
        return paddle.to_tensor(blocks), paddle.to_tensor(offsets)

    def locate_rows(self, block_tables: np.ndarray, seq_index: np.ndarray, positions: np.ndarray) -> paddle.Tensor:
        """As locate, but one int64 tensor [M] of cache rows, block id * block_size + offset (see read_rows)."""
        return paddle.to_tensor(self.row_ids(block_tables, seq_index, positions))

    def row_ids(self, block_tables: np.ndarray, seq_index: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """locate_rows as a NumPy int64 array [M], for callers that derive further indices from the rows."""
        blocks, offsets = self._locate(block_tables, seq_index, positions)
        return blocks * self.block_size + offsets

    def _locate(self, block_tables: np.ndarray, seq_index: np.ndarray,
                positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        positions = np.asarray(positions, dtype=np.int64)
        seq_index = np.asarray(seq_index, dtype=np.int64)
        col = positions // self.block_size
        if positions.size and (positions.min() < 0 or col.max() >= block_tables.shape[1]):
            raise ValueError(f"KVCache.locate: argument 'positions' out of range for a block table of "
                             f"{block_tables.shape[1]} blocks of {self.block_size} (max position "
                             f"{int(positions.max())}, min {int(positions.min())})")
        blocks = np.asarray(block_tables, dtype=np.int64)[seq_index, col]
        if blocks.size and (blocks.min() < 0 or blocks.max() >= self.num_blocks):
            bad = int(np.flatnonzero((blocks < 0) | (blocks >= self.num_blocks))[0])
            raise ValueError(f"KVCache.locate: argument 'block_tables': sequence {int(seq_index[bad])} has block "
                             f"id {int(blocks[bad])} for position {int(positions[bad])} "
                             f"(cache has {self.num_blocks} blocks)")
        return blocks, positions % self.block_size

    def write(self, layer: int, blocks: paddle.Tensor, offsets: paddle.Tensor, values: paddle.Tensor) -> None:
        """Store values [M, *tail] at (blocks[m], offsets[m]) of one layer, in place."""
        self.write_rows(layer, blocks * self.block_size + offsets, values)

    def read(self, layer: int, blocks: paddle.Tensor, offsets: paddle.Tensor) -> paddle.Tensor:
        """Values [M, *tail] stored at (blocks[m], offsets[m]) of one layer (a copy)."""
        return self.read_rows(layer, blocks * self.block_size + offsets)

    # The row forms index a [num_blocks * block_size, *tail] view of the layer with one index tensor: Paddle's
    # two-tensor advanced indexing costs several times a gather / scatter (about 100 us against 12 us per
    # read on the development machine), and the attention of every layer reads and writes the cache once.

    def write_rows(self, layer: int, rows: paddle.Tensor, values: paddle.Tensor) -> None:
        """Store values [M, *tail] at cache rows [M] (distinct) of one layer, in place."""
        if not self.layers[layer].is_contiguous():
            raise ValueError(f"KVCache.write_rows: layer {layer} is not contiguous; a write through its row view "
                             f"would be lost")
        if values.dtype != self.layers[layer].dtype:
            values = values.astype(self.dtype)   # to bfloat16: rounded to nearest even
        if self.dtype == "bfloat16":   # Paddle's CPU scatter has no bf16 kernel; index_put_ has
            paddle.index_put_(self._rows(layer), (rows,), values)
        else:
            paddle.scatter_(self._rows(layer), rows, values, overwrite=True)

    def read_rows(self, layer: int, rows: paddle.Tensor) -> paddle.Tensor:
        """Values [M, *tail] stored at cache rows [M] of one layer (a copy, in the stored dtype)."""
        return paddle.gather(self._rows(layer), rows)

    def read_vectors(self, layer: int, vectors: paddle.Tensor) -> paddle.Tensor:
        """Values [M, tail[-1]] of one layer seen as vectors of its last dimension (a copy, widened to
        `compute_dtype`: the attention's products run there): vector
        `row * V + j` is entry j (C order) of the V = prod(tail[:-1]) vectors of cache row `row`. One gather in
        any order the caller wants, e.g. head-major for attention (layers/paged_attention.py), without moving
        the cache's own position-major layout."""
        tail = self.layer_tails[layer]
        flat = self.layers[layer].reshape([self.num_blocks * self.block_size * int(np.prod(tail[:-1])), tail[-1]])
        out = paddle.gather(flat, vectors)
        return out if self.dtype == self.compute_dtype else out.astype(self.compute_dtype)

    def _rows(self, layer: int) -> paddle.Tensor:
        """Layer `layer` as [num_blocks * block_size, *tail]: a reshape of a contiguous tensor shares its memory,
        so a write through it lands in the layer."""
        return self.layers[layer].reshape([self.num_blocks * self.block_size, *self.layer_tails[layer]])
