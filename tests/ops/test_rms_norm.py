"""fd_cpu_rms_norm (OPS §12) against Paddle's `fused_rms_norm`, which it replaces, bit for bit, and against the
float64 formula: widths not a multiple of the 16 lanes, one row and enough rows to split over threads, 3-D inputs,
with and without a residual; the model's RMSNorm through it; the errors."""
from __future__ import annotations

import numpy as np
import paddle
import pytest
from paddle import _C_ops
from paddle.incubate.nn.functional import fused_rms_norm

from fastdeploy.model_executor.layers import cpu_rms_norm
from fastdeploy.model_executor.layers.transformer import RMSNorm
from fastdeploy.model_executor.ops import _loader

pytestmark = pytest.mark.skipif(not cpu_rms_norm.AVAILABLE, reason="the op needs the CPU's own AVX-512 kernels")

EPS = 1e-5


def bits(t: paddle.Tensor) -> np.ndarray:
    return t.numpy().view(np.uint32)


def formula(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


# widths: below one vector, one vector and one over, the 0.3B's and the MoE's hidden sizes, one with a ragged tail;
# rows: one (a decode step) and 300 x 1024 (above the op's threshold for splitting rows over threads)
@pytest.mark.parametrize("width", [1, 7, 16, 17, 100, 1024, 2560, 3000])
@pytest.mark.parametrize("rows", [1, 3, 300])
@pytest.mark.parametrize("magnitude", [1e-3, 1.0, 50.0])
def test_op_is_paddles_fused_rms_norm_bit_for_bit_and_close_to_the_formula(width, rows, magnitude):
    rng = np.random.default_rng(width * 1000 + rows)
    x = (rng.standard_normal((rows, width)) * magnitude).astype(np.float32)
    residual = (rng.standard_normal((rows, width)) * magnitude).astype(np.float32)
    weight = rng.standard_normal(width).astype(np.float32)
    xt, rt, wt = paddle.to_tensor(x), paddle.to_tensor(residual), paddle.to_tensor(weight)

    out, summed = cpu_rms_norm.rms_norm(xt, wt, EPS)
    assert summed is None
    np.testing.assert_array_equal(bits(out), bits(fused_rms_norm(xt, wt, None, EPS, 1)[0]))
    np.testing.assert_allclose(out.numpy(), formula(x, weight, EPS), rtol=1e-5, atol=1e-6)

    out, summed = cpu_rms_norm.rms_norm(xt, wt, EPS, rt)
    want_out, want_sum = fused_rms_norm(xt, wt, None, EPS, 1, residual=rt)[:2]
    np.testing.assert_array_equal(bits(out), bits(want_out))
    np.testing.assert_array_equal(bits(summed), bits(want_sum))
    np.testing.assert_array_equal(summed.numpy(), x + residual)


def test_a_row_is_normalized_alone_and_a_3d_input_over_its_last_axis():
    rng = np.random.default_rng(1)
    x = paddle.to_tensor(rng.standard_normal((4, 5, 48)).astype(np.float32))
    weight = paddle.to_tensor(rng.standard_normal(48).astype(np.float32))
    whole = cpu_rms_norm.rms_norm(x, weight, EPS)[0]
    assert whole.shape == [4, 5, 48]
    np.testing.assert_array_equal(bits(whole), bits(fused_rms_norm(x, weight, None, EPS, 2)[0]))
    np.testing.assert_array_equal(bits(cpu_rms_norm.rms_norm(x[2, 3:4], weight, EPS)[0])[0], bits(whole)[2, 3])


def test_no_rows_with_a_residual_keep_their_shape():
    x, weight = paddle.zeros([0, 16]), paddle.ones([16])
    out, summed = cpu_rms_norm.rms_norm(x, weight, EPS, paddle.zeros([0, 16]))
    assert out.shape == [0, 16] and summed.shape == [0, 16]


def test_a_negative_zero_comes_out_positive_as_paddles_does():
    x = paddle.to_tensor(np.array([[-0.0, 1.0, -2.0]], np.float32))
    weight = paddle.to_tensor(np.array([1.0, 1.0, 1.0], np.float32))
    out = cpu_rms_norm.rms_norm(x, weight, EPS)[0]
    np.testing.assert_array_equal(bits(out), bits(fused_rms_norm(x, weight, None, EPS, 1)[0]))
    assert not np.signbit(out.numpy()[0, 0])


def test_the_models_rmsnorm_runs_the_op(monkeypatch):
    norm = RMSNorm(64, EPS)
    x = paddle.randn([2, 64])
    residual = paddle.randn([2, 64])
    calls = []
    real = cpu_rms_norm.rms_norm
    monkeypatch.setattr(cpu_rms_norm, "rms_norm", lambda *args: calls.append(len(args)) or real(*args))
    out = norm(x)
    out2, summed = norm(x, residual)
    assert calls == [4, 4]
    np.testing.assert_array_equal(bits(out), bits(fused_rms_norm(x, norm.weight, None, EPS, 1)[0]))
    want_out, want_sum = fused_rms_norm(x, norm.weight, None, EPS, 1, residual=residual)[:2]
    np.testing.assert_array_equal(bits(out2), bits(want_out))
    np.testing.assert_array_equal(bits(summed), bits(want_sum))


@pytest.mark.parametrize("x, weight, residual, message", [
    (paddle.zeros([2, 8], "float64"), paddle.zeros([8]), paddle.zeros([0]), "argument 'x' must be a float32"),
    (paddle.zeros([2, 8]), paddle.zeros([7]), paddle.zeros([0]), "argument 'weight' must be a float32 CPU tensor"),
    (paddle.zeros([2, 8]), paddle.zeros([8]), paddle.zeros([2, 7]), "argument 'residual' must be a float32"),
    (paddle.zeros([2, 8]), paddle.zeros([8]), paddle.zeros([2, 8], "float64"), "argument 'residual' must be a float32"),
    (paddle.zeros([2, 0]), paddle.zeros([0]), paddle.zeros([0]), "argument 'x' must be a float32"),
])
def test_bad_arguments_are_refused_naming_them(x, weight, residual, message):
    _loader.ensure_loaded("_cpu_linear")
    with pytest.raises(Exception, match=message):
        _C_ops._run_custom_op("fd_cpu_rms_norm", x, weight, residual, EPS)
