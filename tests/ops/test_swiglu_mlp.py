"""fd_cpu_swiglu_mlp (OPS §13.1): a decoder layer's norm, gate|up, SwiGLU and down in one op, against the ops it
stands for called one by one (fd_cpu_rms_norm, fd_cpu_linear, Paddle's swiglu, fd_cpu_linear) and a float64
reference, with and without the norm; each row's result alone; the decoder layer, SwiGLU and the MoE experts
taking it where their products are the CPU ops; its errors.

Tolerance (OPS §13.1): the residual sum bit for bit; with float32 weights the output within 1e-5 of its largest
magnitude of the ops one by one (the SwiGLU's expf is glibc's 16-lane one, within 4 ulp of the scalar expf Paddle's
kernel calls); with bf16 and weight-only weights within 2^-8 of it (the down product rounds its input to bf16, and
an input a few ulp apart may round to the neighbouring bf16)."""
from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from fastdeploy.model_executor.layers import fused_attention
from fastdeploy.model_executor.layers.decoder import AttentionShape, DecoderLayer
from fastdeploy.model_executor.layers.moe import ErnieMoE, MoEConfig
from fastdeploy.model_executor.layers.quantization import building
from fastdeploy.model_executor.layers.quantization.base import (KERNEL_DPBF16, KIND_BF16, KIND_F32, KIND_INT4,
                                                                KIND_INT8, cpu_linear, cpu_pack)
from fastdeploy.model_executor.layers.quantization.weight_only import quantize
from fastdeploy.model_executor.layers.transformer import SwiGLU
from fastdeploy.model_executor.ops import _loader
from fastdeploy.precision import Precision, parse_quantization

pytestmark = pytest.mark.skipif(not fused_attention.AVAILABLE, reason="the op needs the CPU's own AVX-512 kernels")

EPS = 1e-6
KINDS = {"float32": KIND_F32, "bfloat16": KIND_BF16, "wint8": KIND_INT8, "wint4": KIND_INT4}
# hidden and intermediate sizes the 16 lanes and the kernel's 64-column blocks do not divide; 1, 5 and 33 rows
SHAPES = [(1, 64, 48), (5, 40, 24), (33, 72, 130)]


def _operands(kind: str, k: int, n: int, rng) -> tuple[paddle.Tensor, paddle.Tensor]:
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    if kind in ("float32", "bfloat16"):
        return cpu_pack(w, KINDS[kind], KERNEL_DPBF16), paddle.zeros([0])
    q, scale = quantize(w, 8 if kind == "wint8" else 4)
    return cpu_pack(q, KINDS[kind], KERNEL_DPBF16), paddle.to_tensor(scale)


def _case(kind: str, m: int, hidden: int, inter: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x, residual = (paddle.to_tensor(rng.standard_normal((m, hidden)).astype(np.float32)) for _ in range(2))
    norm_w = paddle.to_tensor(rng.uniform(0.5, 1.5, hidden).astype(np.float32))
    gate_up, down = _operands(kind, hidden, 2 * inter, rng), _operands(kind, inter, hidden, rng)
    return x, residual, norm_w, gate_up, down


def _op(kind, x, residual, norm_w, gate_up, down, hidden, inter):
    k = KINDS[kind]
    return _loader.cpu_ops().fd_cpu_swiglu_mlp(x, residual, norm_w, *gate_up, *down, EPS, hidden, inter,
                                               k, KERNEL_DPBF16, k, KERNEL_DPBF16)


@pytest.mark.parametrize("m, hidden, inter", SHAPES)
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_op_is_the_ops_one_by_one(kind, m, hidden, inter):
    x, residual, norm_w, gate_up, down = _case(kind, m, hidden, inter)
    out, summed = _op(kind, x, residual, norm_w, gate_up, down, hidden, inter)
    normed, want_sum = _loader.cpu_ops().fd_cpu_rms_norm(x, norm_w, residual, EPS)
    np.testing.assert_array_equal(summed.numpy(), want_sum.numpy())
    k = KINDS[kind]
    act = F.swiglu(cpu_linear(normed, *gate_up, hidden, 2 * inter, k, KERNEL_DPBF16))
    want = cpu_linear(act, *down, inter, hidden, k, KERNEL_DPBF16).numpy()
    assert out.shape == [m, hidden] and out.dtype == paddle.float32
    err = np.abs(out.numpy() - want).max() / np.abs(want).max()
    assert err <= (1e-5 if kind == "float32" else 2.0 ** -8), err


@pytest.mark.parametrize("kind", list(KINDS))
def test_without_a_norm_the_products_take_x(kind):
    """An MoE expert's MLP: norm_weight and residual [0]."""
    m, hidden, inter = 5, 40, 24
    x, _, _, gate_up, down = _case(kind, m, hidden, inter, seed=2)
    out, summed = _op(kind, x, paddle.zeros([0]), paddle.zeros([0]), gate_up, down, hidden, inter)
    assert summed.shape == [0]
    k = KINDS[kind]
    act = F.swiglu(cpu_linear(x, *gate_up, hidden, 2 * inter, k, KERNEL_DPBF16))
    want = cpu_linear(act, *down, inter, hidden, k, KERNEL_DPBF16).numpy()
    err = np.abs(out.numpy() - want).max() / np.abs(want).max()
    assert err <= (1e-5 if kind == "float32" else 2.0 ** -8), err


def _moe_case(kind: str, m: int = 5, hidden: int = 40, inter: int = 24, experts: int = 3, seed: int = 4):
    rng = np.random.default_rng(seed)
    x = paddle.to_tensor(rng.standard_normal((m, hidden)).astype(np.float32))
    ops = [(_operands(kind, hidden, 2 * inter, rng), _operands(kind, inter, hidden, rng)) for _ in range(experts)]
    # every token picks 2 of the experts; the pairs in expert order, as ErnieMoE groups them
    chosen = np.stack([rng.choice(experts, 2, replace=False) for _ in range(m)])
    order = np.argsort(chosen.reshape(-1), kind="stable")
    tokens, weights = order // 2, rng.uniform(0.1, 1.0, order.size).astype(np.float32)
    ends = np.searchsorted(chosen.reshape(-1)[order], np.arange(1, experts + 1))
    runs = [e for e in range(experts) if (chosen == e).any()]
    return x, ops, tokens, weights, ends[runs], runs


def _moe_op(kind, x, ops, tokens, weights, ends, runs, hidden=40, inter=24, shared=None, shared_kind=None,
            shared_inter=0):
    """fd_cpu_moe_experts over the runs' experts; `shared` (gate_up, down) operands of kind `shared_kind` for the
    shared experts of width `shared_inter` (None: [0] tensors)."""
    k, sk = KINDS[kind], KINDS[shared_kind or kind]
    g = [ops[e][0] for e in runs]
    d = [ops[e][1] for e in runs]
    none = paddle.zeros([0])
    shared_tensors = (none,) * 4 if shared is None else (*shared[0], *shared[1])
    return _loader.cpu_ops().fd_cpu_moe_experts(
        x, paddle.to_tensor(tokens.astype(np.int64)), paddle.to_tensor(weights),
        paddle.to_tensor(ends.astype(np.int64)), [p for p, _ in g], [sc for _, sc in g], [p for p, _ in d],
        [sc for _, sc in d], *shared_tensors, hidden, inter, k, KERNEL_DPBF16, k, KERNEL_DPBF16,
        shared_inter, sk, KERNEL_DPBF16, sk, KERNEL_DPBF16)


def _runs_on_the_host(kind, x, ops, tokens, ends, runs, weights) -> np.ndarray:
    want = np.zeros((5, 40), np.float32)
    start = 0
    for e, end in zip(runs, ends):
        rows = paddle.to_tensor(x.numpy()[tokens[start:end]])
        y, _ = _op(kind, rows, paddle.zeros([0]), paddle.zeros([0]), ops[e][0], ops[e][1], 40, 24)
        want[tokens[start:end]] += weights[start:end, None] * y.numpy()
        start = end
    return want


@pytest.mark.parametrize("kind", list(KINDS))
def test_moe_experts_are_the_runs_one_by_one(kind):
    """fd_cpu_moe_experts (OPS §13.2) bit for bit against fd_cpu_swiglu_mlp over each run and the host's sum (the
    weighted rows added run by run, product then sum)."""
    x, ops, tokens, weights, ends, runs = _moe_case(kind)
    (out,) = _moe_op(kind, x, ops, tokens, weights, ends, runs)
    np.testing.assert_array_equal(out.numpy(), _runs_on_the_host(kind, x, ops, tokens, ends, runs, weights))


@pytest.mark.parametrize("kind, shared_kind", [("wint4", "wint8"), ("bfloat16", "bfloat16"), ("float32", "float32")])
def test_the_shared_experts_are_added_after_the_runs(kind, shared_kind):
    """With shared experts (their own width and kind, as ERNIE's wint4 stores them in int8): the routed sum, then
    + fd_cpu_swiglu_mlp over every row, bit for bit the host's `out + shared(x)`."""
    x, ops, tokens, weights, ends, runs = _moe_case(kind)
    rng = np.random.default_rng(9)
    shared = (_operands(shared_kind, 40, 2 * 48, rng), _operands(shared_kind, 48, 40, rng))
    (out,) = _moe_op(kind, x, ops, tokens, weights, ends, runs, shared=shared, shared_kind=shared_kind,
                     shared_inter=48)
    y, _ = _op(shared_kind, x, paddle.zeros([0]), paddle.zeros([0]), *shared, 40, 48)
    want = paddle.to_tensor(_runs_on_the_host(kind, x, ops, tokens, ends, runs, weights)) + y
    np.testing.assert_array_equal(out.numpy(), want.numpy())


def test_moe_experts_errors_name_the_argument():
    x, ops, tokens, weights, ends, runs = _moe_case("wint8")
    with pytest.raises(RuntimeError, match="fd_cpu_moe_experts: argument 'tokens' holds 5"):
        _moe_op("wint8", x, ops, np.where(tokens == 0, 5, tokens), weights, ends, runs)
    with pytest.raises(RuntimeError, match="fd_cpu_moe_experts: argument 'run_ends' must"):
        _moe_op("wint8", x, ops, tokens, weights, ends[::-1].copy(), runs)
    with pytest.raises(RuntimeError, match="fd_cpu_moe_experts: argument 'weights' must be float32"):
        _moe_op("wint8", x, ops, tokens, weights[:-1], ends, runs)
    with pytest.raises(RuntimeError, match="must hold one tensor a run"):
        _moe_op("wint8", x, ops, tokens, weights, ends[:-1], runs)
    with pytest.raises(RuntimeError, match=r"fd_cpu_moe_experts \(run 0\): fd_cpu_swiglu_mlp \(gate_up\): "):
        _moe_op("wint8", x, ops, tokens, weights, ends, runs, inter=23)
    with pytest.raises(RuntimeError, match="fd_cpu_moe_experts: attribute 'shared_intermediate' must be >= 0"):
        _moe_op("wint8", x, ops, tokens, weights, ends, runs, shared_inter=-1)
    with pytest.raises(RuntimeError, match=r"fd_cpu_moe_experts \(shared experts\): fd_cpu_swiglu_mlp \(gate_up\): "):
        _moe_op("wint8", x, ops, tokens, weights, ends, runs, shared_inter=24)   # no shared weights given


def test_float32_against_the_float64_formula():
    m, hidden, inter = 5, 40, 24
    rng = np.random.default_rng(3)
    x, residual = rng.standard_normal((2, m, hidden))
    norm_w = rng.uniform(0.5, 1.5, hidden)
    w_gu, w_down = rng.standard_normal((hidden, 2 * inter)) / 7, rng.standard_normal((inter, hidden)) / 5
    s = x + residual
    h = s / np.sqrt((s * s).mean(-1, keepdims=True) + EPS) * norm_w
    gu = h @ w_gu
    gate, up = gu[:, :inter], gu[:, inter:]
    want = (up * gate / (1 + np.exp(-gate))) @ w_down
    f32 = [paddle.to_tensor(a.astype(np.float32)) for a in (x, residual, norm_w)]
    out, summed = _loader.cpu_ops().fd_cpu_swiglu_mlp(
        *f32, cpu_pack(w_gu.astype(np.float32), KIND_F32, KERNEL_DPBF16), paddle.zeros([0]),
        cpu_pack(w_down.astype(np.float32), KIND_F32, KERNEL_DPBF16), paddle.zeros([0]), EPS, hidden, inter,
        KIND_F32, KERNEL_DPBF16, KIND_F32, KERNEL_DPBF16)
    np.testing.assert_allclose(summed.numpy(), s, rtol=1e-6, atol=1e-6)
    assert np.abs(out.numpy() - want).max() / np.abs(want).max() <= 1e-5


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_row_is_the_same_alone(kind):
    """A verify's rows must each be a decode's, bit for bit (MTP is lossless only so)."""
    m, hidden, inter = 9, 72, 130
    x, residual, norm_w, gate_up, down = _case(kind, m, hidden, inter, seed=5)
    out, summed = _op(kind, x, residual, norm_w, gate_up, down, hidden, inter)
    for r in (0, 4, 8):
        alone = _op(kind, x[r:r + 1], residual[r:r + 1], norm_w, gate_up, down, hidden, inter)
        np.testing.assert_array_equal(alone[0].numpy(), out[r:r + 1].numpy())
        np.testing.assert_array_equal(alone[1].numpy(), summed[r:r + 1].numpy())


def test_no_rows():
    x, residual, norm_w, gate_up, down = _case("wint8", 1, 40, 24)
    out, summed = _op("wint8", x[:0], residual[:0], norm_w, gate_up, down, 40, 24)
    assert out.shape == [0, 40] and summed.shape == [0, 40]


def test_errors_name_the_op_and_the_stage():
    x, residual, norm_w, gate_up, down = _case("bfloat16", 2, 40, 24)
    with pytest.raises(RuntimeError, match=r"fd_cpu_swiglu_mlp: argument 'x' must be a float32 CPU tensor \[M, 40\]"):
        _op("bfloat16", x[:, :39], residual, norm_w, gate_up, down, 40, 24)
    with pytest.raises(RuntimeError, match=r"fd_cpu_swiglu_mlp \(norm\): fd_cpu_rms_norm: argument 'weight'"):
        _op("bfloat16", x, residual, norm_w[:39], gate_up, down, 40, 24)
    with pytest.raises(RuntimeError, match=r"fd_cpu_swiglu_mlp \(gate_up\): fd_cpu_linear: argument 'packed'"):
        _op("bfloat16", x, residual, norm_w, down, down, 40, 24)
    with pytest.raises(RuntimeError, match=r"fd_cpu_swiglu_mlp \(down\): fd_cpu_linear: argument 'packed'"):
        _op("bfloat16", x, residual, norm_w, gate_up, gate_up, 40, 24)
    with pytest.raises(RuntimeError, match="fd_cpu_swiglu_mlp: attributes 'hidden' and 'intermediate'"):
        _op("bfloat16", x, residual, norm_w, gate_up, down, 40, 0)
    with pytest.raises(RuntimeError, match="fd_cpu_swiglu_mlp: argument 'residual' needs a norm"):
        _op("bfloat16", x, residual, paddle.zeros([0]), gate_up, down, 40, 24)


def _layer(precision: Precision, hidden: int = 64, inter: int = 80) -> DecoderLayer:
    shape = AttentionShape(hidden, 4, 2, 16, False, EPS)
    with building(precision):
        return DecoderLayer(0, shape, SwiGLU(hidden, inter))


@pytest.mark.parametrize("dtype, quantization", [("float32", None), ("bfloat16", None), ("bfloat16", "wint8"),
                                                 ("bfloat16", "wint4")])
def test_the_decoder_layer_takes_the_op_where_its_products_are_the_cpu_ops(dtype, quantization):
    layer = _layer(Precision(dtype, parse_quantization(quantization)))
    assert layer.mlp_in_one_op
    rng = np.random.default_rng(11)
    for lin in (layer.mlp.gate_up, layer.mlp.down):
        lin.load_weight(rng.standard_normal((lin.in_features, lin.out_features)).astype(np.float32) / 8)
    x, residual = (paddle.to_tensor(rng.standard_normal((3, 64)).astype(np.float32)) for _ in range(2))
    out, summed = layer.mlp.after_norm(layer.mlp_norm, x, residual)
    h, want_sum = layer.mlp_norm(x, residual)
    want = layer.mlp.down(F.swiglu(layer.mlp.gate_up(h))).numpy()   # the separate ops (mlp(h) is the op too)
    np.testing.assert_array_equal(summed.numpy(), want_sum.numpy())
    err = np.abs(out.numpy() - want).max() / np.abs(want).max()
    assert err <= (1e-5 if dtype == "float32" and quantization is None else 2.0 ** -8), err


def test_swiglu_and_the_moe_experts_take_the_op_without_a_norm():
    cfg = MoEConfig(hidden_size=64, moe_intermediate_size=24, num_experts=4, top_k=2, num_shared_experts=1)
    with building(Precision("bfloat16", parse_quantization("wint8"))):
        mlp, moe = SwiGLU(64, 80), ErnieMoE(cfg)
    assert mlp.in_one_op and moe.experts_in_one_op and moe.shared.in_one_op
    rng = np.random.default_rng(13)
    for lin in (mlp.gate_up, mlp.down):
        lin.load_weight(rng.standard_normal((lin.in_features, lin.out_features)).astype(np.float32) / 8)
    x = paddle.to_tensor(rng.standard_normal((3, 64)).astype(np.float32))
    want = mlp.down(F.swiglu(mlp.gate_up(x))).numpy()
    assert np.abs(mlp(x).numpy() - want).max() / np.abs(want).max() <= 2.0 ** -8
    for lin in [*moe.experts_up_gate, *moe.experts_down, moe.shared.gate_up, moe.shared.down]:
        lin.load_weight(rng.standard_normal((lin.in_features, lin.out_features)).astype(np.float32) / 8)
    moe.gate_weight.set_value(rng.standard_normal((4, 64)).astype(np.float32))
    x = paddle.to_tensor(rng.standard_normal((7, 64)).astype(np.float32))
    got = moe(x).numpy()
    moe.experts_in_one_op = moe.shared.in_one_op = False
    want = moe(x).numpy()
    assert np.abs(got - want).max() / np.abs(want).max() <= 2.0 ** -8


def test_plain_weights_keep_the_layers_one_by_one():
    """Outside a checkpoint build (the embedded models, which train) the products are Paddle's matmul."""
    assert not DecoderLayer(0, AttentionShape(64, 4, 2, 16, False, EPS), SwiGLU(64, 80)).mlp_in_one_op
    assert not _layer(Precision("float64")).mlp_in_one_op
    assert not SwiGLU(64, 80).in_one_op
    assert not ErnieMoE(MoEConfig(hidden_size=64, moe_intermediate_size=24, num_experts=4, top_k=2)).experts_in_one_op
