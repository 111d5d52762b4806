"""Paged KV cache storage (docs/design.md §3): block addressing."""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.kv_cache import KVCache

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
