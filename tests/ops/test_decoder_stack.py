"""fd_cpu_decoder_stack (OPS §13.4): a decode or verify pass through every dense decoder layer in one op, bit for bit
fd_cpu_attention_block then fd_cpu_swiglu_mlp layer after layer, the caches' writes included; a checkpoint model
taking it for decode and verify passes (the same logits, hidden states and cache as its layers one by one) and not
for a prefill pass; a MoE or a q/k norm layer keeping the layers; its errors naming the layer."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers import fused_attention
from fastdeploy.model_executor.layers.decoder import AttentionShape, DecoderLayer, stack_operands
from fastdeploy.model_executor.layers.moe import ErnieMoE, MoEConfig
from fastdeploy.model_executor.layers.quantization import building
from fastdeploy.model_executor.layers.rotary import RotaryEmbedding
from fastdeploy.model_executor.layers.transformer import SwiGLU
from fastdeploy.model_executor.models import get_model
from fastdeploy.model_executor.models.base import ForwardBatch
from fastdeploy.model_executor.ops import _loader
from fastdeploy.precision import Precision, parse_quantization
from tests.checkpoint_files import write_ernie4_5_checkpoint
from tests.ops.test_attention_block import EPS, _case, _operands

pytestmark = pytest.mark.skipif(not fused_attention.AVAILABLE, reason="the op needs the CPU's own AVX-512 kernels")

LAYERS, HIDDEN, INTER, NH, NKV, HD = 3, 64, 40, 4, 2, 16


def _stack_case(kind: str, q_lens: list[int], cache_dtype: str, seed: int = 0):
    x, _, _, _, _, cos, sin, cache, rows = _case(kind, HIDDEN, NH, NKV, HD, q_lens, cache_dtype, seed)
    rng = np.random.default_rng(seed + 1)
    caches = [cache] + [paddle.to_tensor(rng.standard_normal(cache.shape).astype(np.float32)).astype(cache_dtype)
                        for _ in range(LAYERS - 1)]
    norm = lambda: paddle.to_tensor(rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32))  # noqa: E731
    layers = [dict(attn_norm=norm(), qkv=_operands(kind, HIDDEN, (NH + 2 * NKV) * HD, rng),
                   o_proj=_operands(kind, NH * HD, HIDDEN, rng), mlp_norm=norm(),
                   gate_up=_operands(kind, HIDDEN, 2 * INTER, rng), down=_operands(kind, INTER, HIDDEN, rng))
              for _ in range(LAYERS)]
    return x, cos, sin, caches, rows, layers


def _stack_args(x, cos, sin, caches, rows, layers, hidden=HIDDEN):
    lists = [[layer["attn_norm"] for layer in layers]]
    for name in ("qkv", "o_proj", "mlp_norm", "gate_up", "down"):
        if name == "mlp_norm":
            lists.append([layer[name] for layer in layers])
        else:
            lists += [[layer[name].packed for layer in layers], [layer[name].scales for layer in layers]]
    first = layers[0]
    kinds = [v for name in ("qkv", "o_proj", "gate_up", "down") for v in (first[name].kind, first[name].kernel)]
    return (x, paddle.zeros([0]), cos, sin, *rows[:1], *rows[1:], caches, *lists, EPS, hidden, INTER, NH, True,
            1.0 / np.sqrt(HD), *kinds)


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["float32", "bfloat16", "wint8", "wint4"])
@pytest.mark.parametrize("q_lens", [[1], [1, 1, 1], [3, 3]])
def test_the_stack_is_its_layers_one_by_one(kind, cache_dtype, q_lens):
    x, cos, sin, caches, rows, layers = _stack_case(kind, q_lens, cache_dtype)
    apart = [c.clone() for c in caches]
    out, residual = _loader.cpu_ops().fd_cpu_decoder_stack(*_stack_args(x, cos, sin, caches, rows, layers))
    ops = _loader.cpu_ops()
    h, res = x, paddle.zeros([0])
    for layer, cache in zip(layers, apart):
        q, o = layer["qkv"], layer["o_proj"]
        h, res = ops.fd_cpu_attention_block(h, res, layer["attn_norm"], q.packed, q.scales, cos, sin, cache, *rows,
                                            o.packed, o.scales, EPS, HIDDEN, NH, True, 1.0 / np.sqrt(HD), q.kind,
                                            q.kernel, o.kind, o.kernel)
        g, d = layer["gate_up"], layer["down"]
        h, res = ops.fd_cpu_swiglu_mlp(h, res, layer["mlp_norm"], g.packed, g.scales, d.packed, d.scales, EPS, HIDDEN,
                                       INTER, g.kind, g.kernel, d.kind, d.kernel)
    np.testing.assert_array_equal(out.numpy(), h.numpy())
    np.testing.assert_array_equal(residual.numpy(), res.numpy())
    for got, want in zip(caches, apart):
        np.testing.assert_array_equal(got.astype("float32").numpy(), want.astype("float32").numpy())


def test_the_registered_op_is_the_direct_call():
    x, cos, sin, caches, rows, layers = _stack_case("wint8", [2, 2], "bfloat16", seed=4)
    other = [c.clone() for c in caches]
    direct = _loader.cpu_ops().fd_cpu_decoder_stack(*_stack_args(x, cos, sin, caches, rows, layers))
    registered = paddle._C_ops._run_custom_op("fd_cpu_decoder_stack", *_stack_args(x, cos, sin, other, rows, layers))
    for d, r in zip(direct, registered):
        np.testing.assert_array_equal(d.numpy(), r.numpy())
    for a, b in zip(caches, other):
        np.testing.assert_array_equal(a.astype("float32").numpy(), b.astype("float32").numpy())


def test_errors_name_the_op_and_the_layer():
    x, cos, sin, caches, rows, layers = _stack_case("bfloat16", [1, 1], "float32", seed=5)
    with pytest.raises(RuntimeError, match="fd_cpu_decoder_stack: every list argument must hold one tensor a layer"):
        _loader.cpu_ops().fd_cpu_decoder_stack(*_stack_args(x, cos, sin, caches[:2], rows, layers))
    with pytest.raises(RuntimeError, match="fd_cpu_decoder_stack: argument 'caches' must hold one cache layer"):
        _loader.cpu_ops().fd_cpu_decoder_stack(*_stack_args(x, cos, sin, [], rows, layers))
    layers[1]["gate_up"] = layers[1]["down"]
    with pytest.raises(RuntimeError, match=r"fd_cpu_decoder_stack \(layer 1\): fd_cpu_swiglu_mlp \(gate_up\): "
                                           r"fd_cpu_linear: argument 'packed'"):
        _loader.cpu_ops().fd_cpu_decoder_stack(*_stack_args(x, cos, sin, caches, rows, layers))
    with pytest.raises(RuntimeError, match=r"fd_cpu_decoder_stack \(layer 0\): fd_cpu_attention_block: argument 'x'"):
        _loader.cpu_ops().fd_cpu_decoder_stack(*_stack_args(x, cos, sin, caches, rows, layers, hidden=63))


def _pass(model, q_len: int, past: int, seqs: int = 2):
    """A pass of `seqs` sequences, q_len new tokens each after `past` cached positions, over a random cache."""
    block = 16
    blocks = -(-(past + q_len) // block)
    kv = model.new_kv_cache(seqs * blocks, block)
    rng = np.random.default_rng(7)
    for layer in kv.layers:
        layer.set_value(paddle.to_tensor(0.1 * rng.standard_normal(layer.shape).astype(np.float32)).astype(layer.dtype))
    ids = rng.integers(0, model.vocab_size, seqs * q_len)
    positions = np.tile(np.arange(past, past + q_len), seqs)
    tables = np.arange(seqs * blocks, dtype=np.int32).reshape(seqs, blocks)
    return kv, ForwardBatch(ids, positions, np.arange(0, seqs * q_len + 1, q_len), tables)


def _with_and_without(model, kv, batch):
    before = [layer.clone() for layer in kv.layers]
    got = model.forward(batch, kv)
    after = [layer.clone() for layer in kv.layers]
    for layer, saved in zip(kv.layers, before):
        layer.set_value(saved)
    model.net.layers_in_one_op = False
    try:
        want = model.forward(batch, kv)
    finally:
        model.net.layers_in_one_op = True
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    for a, b in zip(after, kv.layers):
        np.testing.assert_array_equal(a.astype("float32").numpy(), b.astype("float32").numpy())


@pytest.mark.parametrize("dtype, quantization", [("float32", None), ("bfloat16", "wint4")])   # every kind: above
def test_a_checkpoint_model_takes_the_stack_for_decode_and_verify_passes(tmp_path, dtype, quantization, monkeypatch):
    model = get_model(str(write_ernie4_5_checkpoint(tmp_path / "ernie")), dtype=dtype, quantization=quantization)
    assert model.net.layers_in_one_op and len(model.net.stack.lists[0]) == model.num_target_layers
    calls = []
    stack = fused_attention.decoder_stack
    monkeypatch.setattr(fused_attention, "decoder_stack", lambda *a: calls.append(1) or stack(*a))
    for q_len in (1, 3):   # a decode pass, a verify of K = 2
        _with_and_without(model, *_pass(model, q_len, past=21))
    assert calls == [1, 1]
    model.forward(*reversed(_pass(model, 12, past=0)))   # a prefill pass: the layers one by one
    assert calls == [1, 1]


def test_a_moe_or_a_qk_norm_keeps_the_layers():
    """stack_operands gives None where some layer cannot run both halves as one op (the model keeps its layers)."""
    with building(Precision("bfloat16", parse_quantization("wint8"))):
        dense = [DecoderLayer(i, AttentionShape(64, 4, 2, 16, False, EPS), SwiGLU(64, 80)) for i in range(2)]
        qk_norm = DecoderLayer(2, AttentionShape(64, 4, 2, 16, True, EPS), SwiGLU(64, 80))
        moe = DecoderLayer(2, AttentionShape(64, 4, 2, 16, False, EPS),
                           ErnieMoE(MoEConfig(hidden_size=64, moe_intermediate_size=24, num_experts=4, top_k=2)))
    rope = RotaryEmbedding(16, 10000.0, "interleaved")
    for lin in [lin for layer in dense for lin in (layer.attn.qkv, layer.attn.out, layer.mlp.gate_up, layer.mlp.down)]:
        lin.load_weight(np.zeros((lin.in_features, lin.out_features), np.float32))
    assert stack_operands(dense, rope) is not None
    assert stack_operands(dense + [qk_norm], rope) is None and stack_operands(dense + [moe], rope) is None
