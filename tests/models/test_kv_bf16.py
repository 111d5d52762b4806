"""A bfloat16 KV cache (docs/models.md "Precision", layers/kv_cache.py): what is stored is the bf16 rounding of the
value (nearest even, against a NumPy reference of the rounding), reading gives it back widened to float32, untouched
blocks stay non-resident, and the P→D port moves the bits unchanged. A reader that took the 16-bit patterns for
float16 fails the first test (docs/testing.md "Precision", planted slips)."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.paged_attention import context_vectors
from fastdeploy.precision import kv_storage_dtype, resolve_kv_cache_dtype
from fastdeploy.worker.kv_transfer import PromptKVPort

TAIL = (2, 3, 8)   # K and V of 3 KV heads of 8


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """The reference: float32 -> bf16 bit patterns, rounded to nearest, ties to even (finite values)."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def widened(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns -> the float32 values they are."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def kv_values(rows: int, seed: int = 0) -> np.ndarray:
    """[rows, *TAIL] float32: normal values of several magnitudes, exact ties both ways, and values float16 cannot
    hold (above its 65504, below its smallest normal)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, *TAIL)) * 10.0 ** rng.integers(-4, 4, (rows, *TAIL))).astype(np.float32)
    flat = x.reshape(-1)
    flat[:8] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), -(1 + 3 * 2 ** -8), 3.0e5, -7.0e4, 3.0e-7, 1.0]
    return x


def test_written_values_are_their_bf16_rounding_and_read_back_widened():
    kv = KVCache(6, 4, [TAIL], "bfloat16")
    assert (kv.dtype, kv.compute_dtype, kv.layers[0].dtype) == ("bfloat16", "float32", paddle.bfloat16)
    x = kv_values(5)
    rows = np.array([3, 20, 0, 9, 17])
    kv.write_rows(0, paddle.to_tensor(rows), paddle.to_tensor(x))
    want = bf16_bits(x)
    assert want[0, 0, 0, :4].tolist() == [0x3F80, 0x3F82, 0xBF80, 0xBF82]   # ties went to the even neighbour
    view = kv.host_view(0)
    assert view.dtype == np.uint16 and view.ctypes.data == kv.layers[0].data_ptr()
    np.testing.assert_array_equal(view.reshape(24, *TAIL)[rows], want)
    stored = kv.read_rows(0, paddle.to_tensor(rows))
    assert stored.dtype == paddle.bfloat16
    np.testing.assert_array_equal(stored.astype("float32").numpy(), widened(want))
    k_ids, v_ids = context_vectors(rows, 3)   # the attention's gather: widened to float32
    k = kv.read_vectors(0, k_ids)
    assert k.dtype == paddle.float32
    np.testing.assert_array_equal(k.numpy().reshape(3, 5, 8), widened(want)[:, 0].transpose(1, 0, 2))
    np.testing.assert_array_equal(kv.read_vectors(0, v_ids).numpy().reshape(3, 5, 8),
                                  widened(want)[:, 1].transpose(1, 0, 2))
    assert not np.array_equal(widened(want), want.view(np.float16).astype(np.float32))   # float16's reading differs


def test_kv_dtype_follows_the_model_and_the_flag_overrides_it():
    assert resolve_kv_cache_dtype("auto", "bfloat16", None) == "bfloat16"
    assert resolve_kv_cache_dtype("auto", "float32", "wint8") == "bfloat16"   # the products take bf16 inputs
    assert resolve_kv_cache_dtype("auto", "float32", None) == "float32"
    assert resolve_kv_cache_dtype("auto", "float64", None) == "float64"
    assert resolve_kv_cache_dtype("float32", "bfloat16", "wint4") == "float32"
    assert resolve_kv_cache_dtype("bfloat16", "float32", None) == "bfloat16"
    with pytest.raises(ValueError, match="'kv_cache_dtype'"):
        resolve_kv_cache_dtype("float16", "bfloat16", None)
    assert kv_storage_dtype("bfloat16") == np.uint16 and kv_storage_dtype("bfloat16").str == "<u2"
    assert kv_storage_dtype("float32").itemsize == 4


def test_a_float64_model_reads_a_bf16_cache_in_float64():
    kv = KVCache(2, 2, [(4,)], "bfloat16", compute_dtype="float64")
    x = np.array([[1 + 2 ** -8, 0.1, -3.3, 7e4]], np.float64)
    kv.write_rows(0, paddle.to_tensor([1]), paddle.to_tensor(x))
    out = kv.read_vectors(0, paddle.to_tensor([1]))
    assert out.dtype == paddle.float64
    np.testing.assert_array_equal(out.numpy(), widened(bf16_bits(x.astype(np.float32))))


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_untouched_blocks_are_not_resident():
    """1 GiB of bf16 blocks: creating the cache and writing one row makes far less than that resident."""
    before = _resident_bytes()
    kv = KVCache(1024, 64, [(2, 8, 128)] * 4, "bfloat16")   # 4 layers x 256 MiB
    kv.write_rows(2, paddle.to_tensor([5]), paddle.ones([1, 2, 8, 128]))
    assert kv.host_view(2)[0, 5, 0, 0, 0] == 0x3F80
    grown = _resident_bytes() - before
    assert sum(v.nbytes for v in (kv.host_view(i) for i in range(4))) == 2 ** 30
    assert grown < 48 * 2 ** 20, grown


def test_the_hand_off_port_moves_the_bits_unchanged():
    """P's port reads a prompt's bf16 KV as uint16 arrays ('<u2' on the wire), D's writes them into its blocks:
    D reads back exactly P's values."""
    p_kv, d_kv = KVCache(8, 4, [TAIL, TAIL], "bfloat16"), KVCache(8, 4, [TAIL, TAIL], "bfloat16")
    p_port, d_port = PromptKVPort(p_kv, 1), PromptKVPort(d_kv, 1)
    x = kv_values(10, seed=1)
    p_blocks, d_blocks = [6, 2, 5], [1, 7, 3]
    for layer in range(2):
        rows = np.array([b * 4 + o for b in p_blocks for o in range(4)][:10])
        p_kv.write_rows(layer, paddle.to_tensor(rows), paddle.to_tensor(x * (layer + 1)))
    target, mtp = p_port.read_prompt_kv(p_blocks, 10)
    assert [a.dtype for a in target + mtp] == [np.uint16, np.uint16]
    assert [s.dtype for s in p_port.placed_kv(10).target] == ["<u2"]
    assert p_port.layout.dtype == "bfloat16"
    d_port.write_prompt_kv(d_blocks, target, mtp)
    for layer in range(2):
        rows = np.array([b * 4 + o for b in d_blocks for o in range(4)][:10])
        np.testing.assert_array_equal(d_kv.read_rows(layer, paddle.to_tensor(rows)).astype("float32").numpy(),
                                      widened(bf16_bits(x * (layer + 1))))
