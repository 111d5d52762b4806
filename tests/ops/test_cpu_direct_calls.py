"""The CPU ops called through `_cpu_linear`'s Python functions (custom_ops/cpu_ops/python_calls.cc), as the layers
call them, against the same ops called through Paddle's registered-op entry: the same outputs bit for bit, the same
in-place cache writes, strided inputs taken as Paddle's entry takes them, a strided cache the op would write
refused, and the ops' own errors."""
from __future__ import annotations

import numpy as np
import paddle
import pytest
from paddle import _C_ops

from fastdeploy.model_executor.layers import fused_attention
from fastdeploy.model_executor.layers.quantization.base import KERNEL_DPBF16, KIND_BF16, KIND_F32, KIND_INT4, KIND_INT8
from fastdeploy.model_executor.ops import _loader

pytestmark = pytest.mark.skipif(not fused_attention.AVAILABLE, reason="the ops need the CPU's own AVX-512 kernels")

RNG = np.random.default_rng(7)


def tensor(*shape, dtype="float32") -> paddle.Tensor:
    return paddle.to_tensor(RNG.standard_normal(shape).astype(np.float32)).astype(dtype)


def same(direct, registered) -> None:
    assert len(direct) == len(registered)
    for d, r in zip(direct, registered):
        assert d.dtype == r.dtype and d.shape == r.shape
        np.testing.assert_array_equal(d.numpy(), r.numpy())


def both(name: str, *args):
    """(the direct call's outputs, the registered op's outputs) of op `name` on the same arguments."""
    return getattr(_loader.cpu_ops(), name)(*args), _C_ops._run_custom_op(name, *args)


@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm(residual):
    x, w = tensor(3, 40), tensor(40)
    same(*both("fd_cpu_rms_norm", x, w, tensor(3, 40) if residual else paddle.zeros([0]), 1e-5))


@pytest.mark.parametrize("kind", [KIND_F32, KIND_BF16, KIND_INT8, KIND_INT4])
def test_pack_linear_and_columns(kind):
    k, n = 96, 40
    w = (RNG.standard_normal((k, n)).astype(np.float32) if kind in (KIND_F32, KIND_BF16)
         else RNG.integers(-7, 8, (k, n)).astype(np.int8))
    packed, registered = both("fd_cpu_pack_weight", paddle.to_tensor(w), kind, KERNEL_DPBF16)
    same(packed, registered)
    scales = tensor(n) if kind in (KIND_INT8, KIND_INT4) else paddle.zeros([0])
    same(*both("fd_cpu_linear", tensor(5, k), packed[0], scales, k, n, kind, KERNEL_DPBF16))
    if kind in (KIND_F32, KIND_BF16):
        ids = paddle.to_tensor(np.array([3, 0, 39], np.int64))
        same(*both("fd_cpu_packed_columns", packed[0], ids, k, n, kind, KERNEL_DPBF16))


def test_attention_and_the_cache_write():
    nh, nkv, hd, blocks, block = 4, 2, 32, 4, 16
    cache = tensor(blocks, block, 2, nkv, hd)
    ctx_rows = paddle.to_tensor(RNG.permutation(blocks * block)[:40].reshape(2, 20).astype(np.int64))
    same(*both("fd_cpu_decode_attention", tensor(3, nh, hd), cache, ctx_rows,
               paddle.to_tensor(np.array([0, 1, 1], np.int32)), paddle.to_tensor(np.array([20, 7, 19], np.int32)),
               0.125))
    same(*both("fd_cpu_prefill_attention", tensor(6, nh, hd), cache, ctx_rows[0], 0.125))

    qkv, cos, sin = tensor(5, (nh + 2 * nkv) * hd), tensor(5, 1, hd), tensor(5, 1, hd)
    rows = paddle.to_tensor(np.array([9, 2, 40, 63, 17], np.int64))
    caches = [paddle.zeros([blocks, block, 2, nkv, hd]) for _ in range(2)]
    direct = _loader.cpu_ops().fd_cpu_rope_cache_write(qkv, cos, sin, caches[0], rows, nh, False)
    registered = _C_ops._run_custom_op("fd_cpu_rope_cache_write", qkv, cos, sin, caches[1], rows, nh, False)
    same(direct, registered)
    assert np.abs(caches[0].numpy()).sum() > 0
    np.testing.assert_array_equal(caches[0].numpy(), caches[1].numpy())


def test_strided_inputs_are_read_as_their_values():
    w = tensor(40)
    x = tensor(40, 3).T                     # [3, 40], a transposed view
    assert not x.is_contiguous()
    same(_loader.cpu_ops().fd_cpu_rms_norm(x, w, paddle.zeros([0]), 1e-5),
         _C_ops._run_custom_op("fd_cpu_rms_norm", x.contiguous(), w, paddle.zeros([0]), 1e-5))


def test_a_strided_cache_the_op_writes_is_refused():
    nh, nkv, hd = 2, 1, 16
    cache = paddle.zeros([16, 4, 2, nkv, hd]).transpose([1, 0, 2, 3, 4])    # [4, 16, ...], strided
    assert not cache.is_contiguous()
    with pytest.raises(RuntimeError, match="fd_cpu_rope_cache_write: argument 'cache' must be contiguous"):
        _loader.cpu_ops().fd_cpu_rope_cache_write(tensor(2, (nh + 2 * nkv) * hd), tensor(2, 1, hd),
                                                  tensor(2, 1, hd), cache, paddle.to_tensor(np.array([0, 1])), nh,
                                                  False)


def test_the_ops_errors_name_the_argument():
    with pytest.raises(RuntimeError, match="fd_cpu_rms_norm: argument 'weight'"):
        _loader.cpu_ops().fd_cpu_rms_norm(tensor(2, 8), tensor(7), paddle.zeros([0]), 1e-5)
    with pytest.raises(TypeError):
        _loader.cpu_ops().fd_cpu_rms_norm(tensor(2, 8), "weight", paddle.zeros([0]), 1e-5)


def test_swiglu_mlp():
    h, i = 40, 24
    gate_up = _loader.cpu_ops().fd_cpu_pack_weight(tensor(h, 2 * i), KIND_BF16, KERNEL_DPBF16)[0]
    down = _loader.cpu_ops().fd_cpu_pack_weight(tensor(i, h), KIND_BF16, KERNEL_DPBF16)[0]
    same(*both("fd_cpu_swiglu_mlp", tensor(3, h), tensor(3, h), tensor(h), gate_up, paddle.zeros([0]), down,
               paddle.zeros([0]), 1e-5, h, i, KIND_BF16, KERNEL_DPBF16, KIND_BF16, KERNEL_DPBF16))


def test_moe_experts():
    h, i = 40, 24
    pack = _loader.cpu_ops().fd_cpu_pack_weight
    gate_ups = [pack(tensor(h, 2 * i), KIND_BF16, KERNEL_DPBF16)[0] for _ in range(2)]
    downs = [pack(tensor(i, h), KIND_BF16, KERNEL_DPBF16)[0] for _ in range(2)]
    no = [paddle.zeros([0]), paddle.zeros([0])]
    shared = [pack(tensor(h, 4 * i), KIND_BF16, KERNEL_DPBF16)[0], no[0], pack(tensor(2 * i, h), KIND_BF16,
                                                                             KERNEL_DPBF16)[0], no[0]]
    same(*both("fd_cpu_moe_experts", tensor(3, h), paddle.to_tensor(np.array([0, 2, 1, 2], np.int64)), tensor(4),
               paddle.to_tensor(np.array([2, 4], np.int64)), gate_ups, no, downs, no, *shared, h, i, KIND_BF16,
               KERNEL_DPBF16, KIND_BF16, KERNEL_DPBF16, 2 * i, KIND_BF16, KERNEL_DPBF16, KIND_BF16, KERNEL_DPBF16))
