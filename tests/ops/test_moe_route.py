"""fd_cpu_moe_route (OPS §13.5): an ERNIE MoE layer's router and the grouping of its choices by expert, against
a NumPy reference of the contract (ErnieMoE.route's formula, then the pairs sorted by expert); a row's choice the
same alone and in a batch, bit for bit; the correction bias choosing but never weighing; norm_min; the grouping's
shape; the MoE layer taking it; its errors."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers import fused_attention
from fastdeploy.model_executor.layers.moe import ErnieMoE, MoEConfig
from fastdeploy.model_executor.layers.quantization import building
from fastdeploy.model_executor.ops import _loader
from fastdeploy.precision import Precision, parse_quantization

pytestmark = pytest.mark.skipif(not fused_attention.AVAILABLE, reason="the op needs the CPU's own AVX-512 kernels")


def _route(x, gate, bias, top_k, norm_min=1e-12):
    outs = _loader.cpu_ops().fd_cpu_moe_route(*(paddle.to_tensor(a) for a in (x, gate, bias)), top_k, norm_min)
    return [o.numpy() for o in outs]


def _reference(x, gate, bias, top_k, norm_min=1e-12):
    """The contract in NumPy (float64 logits: the op's own summation order is its own) -> chosen, weights [M, k]."""
    logits = x.astype(np.float64) @ gate.T.astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    chosen = np.argsort(-(p + bias), axis=-1, kind="stable")[:, :top_k]
    w = np.take_along_axis(p, chosen, -1)
    return chosen, w / np.maximum(w.sum(-1, keepdims=True), norm_min)


def _ungroup(tokens, weights, run_ends, experts, m, top_k):
    """The op's grouped pairs back to each row's {expert: weight}, checking the grouping's order on the way."""
    rows = [dict() for _ in range(m)]
    start = 0
    assert np.all(np.diff(experts) > 0) and run_ends[-1] == m * top_k and np.all(np.diff(run_ends) > 0)
    for end, e in zip(run_ends, experts):
        assert np.all(np.diff(tokens[start:end]) > 0)          # rows in order within an expert, each once
        for t, w in zip(tokens[start:end], weights[start:end]):
            rows[t][int(e)] = w
        start = end
    return rows


@pytest.mark.parametrize("m, h, e, k", [(1, 64, 64, 6), (7, 40, 16, 4), (33, 2560, 64, 6), (5, 17, 3, 3)])
def test_the_op_is_the_contract(m, h, e, k):
    rng = np.random.default_rng(m + h)
    x = rng.standard_normal((m, h)).astype(np.float32)
    gate = (rng.standard_normal((e, h)) / np.sqrt(h)).astype(np.float32)
    bias = (0.01 * rng.standard_normal(e)).astype(np.float32)
    tokens, weights, run_ends, experts = _route(x, gate, bias, k)
    assert tokens.dtype == np.int64 and weights.dtype == np.float32 and tokens.shape == (m * k,)
    chosen, want = _reference(x, gate, bias, k)
    rows = _ungroup(tokens, weights, run_ends, experts, m, k)
    for r in range(m):
        assert sorted(rows[r]) == sorted(chosen[r].tolist())
        np.testing.assert_allclose([rows[r][c] for c in chosen[r]], want[r], rtol=1e-5, atol=1e-6)


def test_a_row_routes_the_same_alone_and_in_a_batch():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, 200)).astype(np.float32)
    gate, bias = rng.standard_normal((32, 200)).astype(np.float32) / 14, np.zeros(32, np.float32)
    rows = _ungroup(*_route(x, gate, bias, 4), 9, 4)
    for r in (0, 4, 8):
        alone = _ungroup(*_route(x[r:r + 1], gate, bias, 4), 1, 4)[0]
        assert alone == rows[r]   # experts and weights bit for bit


def test_the_bias_chooses_but_never_weighs():
    rng = np.random.default_rng(5)
    x, gate = rng.standard_normal((4, 32)).astype(np.float32), rng.standard_normal((8, 32)).astype(np.float32)
    bias = np.zeros(8, np.float32)
    bias[6] = 10.0
    rows = _ungroup(*_route(x, gate, bias, 2), 4, 2)
    chosen, want = _reference(x, gate, bias, 2)
    for r in range(4):
        assert 6 in rows[r]
        np.testing.assert_allclose([rows[r][c] for c in chosen[r]], want[r], rtol=1e-5)


def test_norm_min_bounds_the_renormalisation():
    x, gate, bias = np.ones((1, 16), np.float32), np.zeros((4, 16), np.float32), np.zeros(4, np.float32)
    tokens, weights, run_ends, experts = _route(x, gate, bias, 2, norm_min=1.0)
    np.testing.assert_array_equal(experts, [0, 1])       # equal scores: the lower index first
    np.testing.assert_array_equal(weights, [0.25, 0.25])  # p = 1/4 each, their sum 0.5 below norm_min 1


def test_no_rows():
    tokens, weights, run_ends, experts = _route(np.zeros((0, 16), np.float32), np.ones((4, 16), np.float32),
                                                np.zeros(4, np.float32), 2)
    assert tokens.shape == (0,) and weights.shape == (0,) and run_ends.shape == (0,) and experts.shape == (0,)


def test_the_registered_op_is_the_direct_call():
    rng = np.random.default_rng(9)
    args = [paddle.to_tensor(a) for a in (rng.standard_normal((5, 48)).astype(np.float32),
                                          rng.standard_normal((12, 48)).astype(np.float32),
                                          rng.standard_normal(12).astype(np.float32) / 100)]
    direct = _loader.cpu_ops().fd_cpu_moe_route(*args, 3, 1e-12)
    registered = paddle._C_ops._run_custom_op("fd_cpu_moe_route", *args, 3, 1e-12)
    for d, r in zip(direct, registered):
        np.testing.assert_array_equal(d.numpy(), r.numpy())


def test_errors_name_the_argument():
    x, gate, bias = np.ones((2, 16), np.float32), np.ones((4, 16), np.float32), np.zeros(4, np.float32)
    with pytest.raises(RuntimeError, match=r"fd_cpu_moe_route: argument 'gate' must be a float32 CPU tensor \[E, 16\]"):
        _route(x, gate[:, :15], bias, 2)
    with pytest.raises(RuntimeError, match=r"fd_cpu_moe_route: argument 'bias' must be a float32 CPU tensor \[4\]"):
        _route(x, gate, bias[:3], 2)
    with pytest.raises(RuntimeError, match=r"fd_cpu_moe_route: attribute 'top_k' must be in 1 \.\. 4, got 5"):
        _route(x, gate, bias, 5)
    with pytest.raises(RuntimeError, match="fd_cpu_moe_route: argument 'x' must be a float32 CPU tensor"):
        _route(x.astype(np.float64), gate, bias, 2)


def test_the_moe_layer_routes_through_the_op_where_its_experts_are_cpu_ops(monkeypatch):
    cfg = MoEConfig(hidden_size=64, moe_intermediate_size=24, num_experts=8, top_k=2, num_shared_experts=1)
    with building(Precision("bfloat16", parse_quantization("wint8"))):
        moe = ErnieMoE(cfg)
    rng = np.random.default_rng(13)
    for lin in [*moe.experts_up_gate, *moe.experts_down, moe.shared.gate_up, moe.shared.down]:
        lin.load_weight(rng.standard_normal((lin.in_features, lin.out_features)).astype(np.float32) / 8)
    moe.gate_weight.set_value(rng.standard_normal((8, 64)).astype(np.float32))
    monkeypatch.setattr(ErnieMoE, "route", lambda *a: pytest.fail("the host router ran"))
    x = paddle.to_tensor(rng.standard_normal((5, 64)).astype(np.float32))
    got = moe(x).numpy()
    monkeypatch.undo()
    moe.experts_in_one_op = False   # the host's router and each expert as its own layer call
    want = moe(x).numpy()
    assert np.abs(got - want).max() / np.abs(want).max() <= 2.0 ** -8
