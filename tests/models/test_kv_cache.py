"""Paged KV cache storage (docs/design.md §3): block addressing."""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.paged_attention import context_vectors

TAILS = [(2, 3), (4,), (1,)]


def test_write_then_read_through_block_table_round_trips():
    """A value written at position p of a sequence is read back at p through the same block table."""
    kv = KVCache(8, 4, [(3,)], "float32")
    table = np.array([[5, 2, -1], [7, 0, 1]], np.int32)
    seq, pos = np.array([0, 0, 1, 1]), np.array([3, 5, 0, 9])
    values = paddle.to_tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
    kv.write(0, *kv.locate(table, seq, pos), values)
    np.testing.assert_array_equal(kv.read(0, *kv.locate(table, seq, pos)).numpy(), values.numpy())
    assert kv.layers[0].numpy()[2, 1].tolist() == [3.0, 4.0, 5.0]   # seq 0, position 5 -> block 2, offset 1


def test_read_vectors_takes_entries_of_the_last_dimension_in_any_order():
    """Vector row * V + j is entry j (C order over the tail's leading dims) of cache row `row`; the layout the cache
    stores is untouched, and context_vectors' head-major ids pick K of every head, then V of every head."""
    kv = KVCache(3, 4, [(2, 3, 5)], "float64")
    kv.layers[0] = paddle.to_tensor(np.arange(3 * 4 * 30, dtype=np.float64).reshape(3, 4, 2, 3, 5))
    rows = np.array([7, 0, 11])                    # block 1 offset 3, block 0 offset 0, block 2 offset 3
    k_ids, v_ids = context_vectors(rows, 3)
    flat = kv.layers[0].numpy().reshape(12, 2, 3, 5)
    np.testing.assert_array_equal(kv.read_vectors(0, k_ids).numpy().reshape(3, 3, 5),
                                  flat[rows, 0].transpose(1, 0, 2))
    np.testing.assert_array_equal(kv.read_vectors(0, v_ids).numpy().reshape(3, 3, 5),
                                  flat[rows, 1].transpose(1, 0, 2))
    assert kv.layers[0].shape == [3, 4, 2, 3, 5]


def test_locate_refuses_positions_without_a_block():
    """Reading or writing through a -1 block id (or past the table) is an error, not a silent write elsewhere."""
    kv = KVCache(8, 4, [(1,)], "float32")
    table = np.array([[5, -1]], np.int32)
    with pytest.raises(ValueError, match="'block_tables'.*block id -1 for position 4"):
        kv.locate(table, np.array([0]), np.array([4]))
    with pytest.raises(ValueError, match="'positions'"):
        kv.locate(table, np.array([0]), np.array([8]))


def test_constructor_validates_its_arguments():
    """Errors name the argument."""
    with pytest.raises(ValueError, match="'num_blocks'"):
        KVCache(0, 4, [(1,)])
    with pytest.raises(ValueError, match="'dtype'"):
        KVCache(1, 4, [(1,)], "int8")
    with pytest.raises(ValueError, match="'layer_tails'"):
        KVCache(1, 4, [])
