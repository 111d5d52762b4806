"""ERNIE-4.5 MoE (`Ernie4_5_MoeForCausalLM`, the 21B-A3B / 300B-A47B family) and ERNIE's MTP module
(docs/models.md "ERNIE-4.5 MoE and MTP").

The target is ERNIE-4.5 dense (models/ernie4_5.py) with the MLP of layer i replaced by layers/moe.py's ErnieMoE
when `moe_layer_start_index <= i <= moe_layer_end_index and (i + 1) % moe_layer_interval == 0` (transformers',
vLLM's rule; FastDeploy's `i >= start` is the same for interval 1).

The MTP module (FastDeploy `ernie4_5_mtp.py`), cache layer N = num_hidden_layers, after the N target layers, so the
P->D hand-off and the prefix cache carry it with the rest: at position p, with t the token at p + 1 and h the
target's hidden state at p AFTER its final norm,
    y = mtp_block.0(mtp_linear_proj(concat[mtp_emb_norm(embed(t)), mtp_hidden_norm(h)]))
and the token at p + 2 is predicted by the target's final norm and head (shared, as is the embedding). The runner
passes back what forward / mtp_forward return as "hidden", which here is the residual stream before the final norm
(the target's last layer output, the MTP block's output); mtp_forward applies the shared final norm to it first,
so a chained draft (K > 1) is fed the MTP's post-norm output, as FastDeploy chains it.

Its weights are `model.mtp_*` / `ernie.mtp_*` tensors of the main directory or of the directory given as
`--speculative-config '{"method": "mtp", "model": PATH}'` (`mtp_model`); loaded only when MTP is asked for.
"""
from __future__ import annotations

import numpy as np
import paddle
from paddle import nn

from fastdeploy.model_executor.layers.quantization import building as building_precision
from fastdeploy.model_executor.layers.decoder import DecoderLayer
from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.moe import ErnieMoE, MoEConfig
from fastdeploy.model_executor.layers.transformer import Linear, RMSNorm, SwiGLU, stored_weight_bytes
from fastdeploy.model_executor.models.base import ForwardBatch, take_rows
from fastdeploy.model_executor.models.checkpoint import Checkpoint, CheckpointConfig, read_checkpoint_config
from fastdeploy.model_executor.models.decoder_lm import (DecoderShape, WeightLoader, _assign, _unfilled_parameters,
                                                         load_attention, load_swiglu)
from fastdeploy.model_executor.models.ernie4_5 import Ernie4_5ForCausalLM
from fastdeploy.precision import Precision, parse_quantization

MTP_PREFIX = "model.mtp_"


def moe_layers(config: CheckpointConfig, num_layers: int) -> tuple[MoEConfig, frozenset[int]]:
    """The MoE shape and the indices of the MoE layers, from config.json's `moe_*` fields."""
    for name in ("moe_num_experts", "moe_intermediate_size", "moe_layer_start_index", "moe_layer_end_index"):
        if isinstance(config.raw.get(name), list):   # ERNIE-4.5-VL: one value per modality
            raise config.invalid(f"config.json: field '{name}' is a list (a multimodal ERNIE-4.5-VL checkpoint); "
                                 f"text MoE checkpoints only")
    gate = config.get("moe_gate", str, "topk")
    if gate != "topk":
        raise config.invalid(f"config.json: field 'moe_gate' ({gate!r}) is not supported (topk only)")
    start = _index(config, "moe_layer_start_index", 1)
    end = _index(config, "moe_layer_end_index", -1)
    end = num_layers - 1 if end == -1 else end
    interval = config.get("moe_layer_interval", int, 1)
    shared = config.raw.get("moe_num_shared_experts", 0)
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
        raise config.invalid(f"config.json: field 'moe_num_shared_experts' must be an int >= 0, got {shared!r}")
    norm_min = float(config.get("moe_norm_min", (int, float), 1e-12))
    experts, k = config.get("moe_num_experts"), config.get("moe_k")
    if k > experts:
        raise config.invalid(f"config.json: field 'moe_k' ({k}) must be at most 'moe_num_experts' ({experts})")
    moe = MoEConfig(config.get("hidden_size"), config.get("moe_intermediate_size"), experts, k, shared, norm_min)
    return moe, frozenset(i for i in range(num_layers) if start <= i <= end and (i + 1) % interval == 0)


def _index(config: CheckpointConfig, name: str, default: int) -> int:
    """A layer index field (0 and -1 allowed, unlike CheckpointConfig.get's positive ints)."""
    value = config.raw.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < -1:
        raise config.invalid(f"config.json: field '{name}' must be a layer index (int >= -1), got {value!r}")
    return value


class ErnieMTP(nn.Layer):
    """The MTP module's own parameters (embedding, final norm and head are the target's)."""

    def __init__(self, shape: DecoderShape, layer_index: int):
        super().__init__()
        h, eps = shape.hidden_size, shape.attention.rms_eps
        self.emb_norm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)
        self.linear_proj = Linear(2 * h, h)
        self.block = DecoderLayer(layer_index, shape.attention, SwiGLU(h, shape.intermediate_size))

    def load(self, loader: WeightLoader, shape: DecoderShape) -> None:
        h = shape.hidden_size
        _assign(self.emb_norm.weight, loader.vector(MTP_PREFIX + "emb_norm.0.weight", h))
        _assign(self.hidden_norm.weight, loader.vector(MTP_PREFIX + "hidden_norm.0.weight", h))
        self.linear_proj.load_weight(loader.linear(MTP_PREFIX + "linear_proj.0.weight", 2 * h, h))
        prefix = MTP_PREFIX + "block.0."
        load_attention(loader, self.block, prefix, shape.attention)
        load_swiglu(loader, self.block.mlp, prefix + "mlp.", h, shape.intermediate_size)


class Ernie4_5_MoeForCausalLM(Ernie4_5ForCausalLM):
    ARCHITECTURE = "Ernie4_5_MoeForCausalLM"

    def __init__(self, config: CheckpointConfig, dtype: str = "float32", name: str | None = None,
                 tokenizer=None, mtp: bool = False, mtp_model: str | None = None, quantization=None,
                 mtp_quantization=None):
        """mtp_quantization: the MTP module's own (the speculative config's 'quantization'); None: the target's."""
        self.moe, self.moe_layer_ids = moe_layers(config, config.get("num_hidden_layers"))
        self.mtp: ErnieMTP | None = None
        self._mtp_wanted, self._mtp_model = mtp, mtp_model
        if mtp_model is not None and not mtp:
            raise ValueError(f"{self.ARCHITECTURE}: argument 'mtp_model' ({mtp_model!r}) needs mtp=True")
        try:   # the MTP block is dense: its "wint4" is WINT4 throughout
            self.mtp_precision = Precision(dtype, parse_quantization(
                quantization if mtp_quantization is None else mtp_quantization))
        except ValueError as e:
            raise ValueError(f"{self.ARCHITECTURE}: speculative config: {e}") from None
        super().__init__(config, dtype=dtype, name=name, tokenizer=tokenizer, quantization=quantization)

    def has_experts(self) -> bool:
        return bool(self.moe_layer_ids)

    def check_header_shapes(self) -> None:
        super().check_header_shapes()
        names = {WeightLoader.canonical(n) for n in self.config.tensors}
        for i in sorted(self.moe_layer_ids):
            p, e = f"model.layers.{i}.mlp.experts.", self.moe.num_experts
            if not any(n.startswith(f"{p}{e - 1}.") for n in names) or any(n.startswith(f"{p}{e}.") for n in names):
                raise self.config.invalid(f"config.json: field 'moe_num_experts' ({e}) does not match the weights "
                                          f"of layer {i} ('{p}*')")

    def build_mlp(self, layer: int) -> nn.Layer:
        if layer in self.moe_layer_ids:
            return ErnieMoE(self.moe)
        return super().build_mlp(layer)

    def load_mlp(self, loader: WeightLoader, layer: int, prefix: str) -> None:
        if layer not in self.moe_layer_ids:
            return super().load_mlp(loader, layer, prefix)
        moe: ErnieMoE = self.net.layers[layer].mlp
        c, p = self.moe, prefix + "mlp."
        # the router [E, H] as the torch layout stores it ([H, E] in the Paddle layout); it routes in float32
        _assign(moe.gate_weight, np.ascontiguousarray(loader.linear(p + "gate.weight", c.hidden_size,
                                                                    c.num_experts).T))
        bias = p + "moe_statics.e_score_correction_bias"
        if loader.has(bias):
            _assign(moe.e_score_correction_bias, loader.matrix(bias, 1, c.num_experts).reshape(-1))
        i = c.moe_intermediate_size
        up_gate, down = [], []
        for j in range(c.num_experts):
            e = f"{p}experts.{j}."
            up_gate.append(loader.fused_linear(e + "up_gate_proj.weight", [(e + "gate_proj.weight", i),
                                                                           (e + "up_proj.weight", i)], c.hidden_size))
            down.append(loader.linear(e + "down_proj.weight", i, c.hidden_size))
        for j in range(c.num_experts):
            moe.experts_up_gate[j].load_weight(up_gate[j])
            moe.experts_down[j].load_weight(down[j])
        if moe.shared is not None:
            load_swiglu(loader, moe.shared, p + "shared_experts.", c.hidden_size, i * c.num_shared_experts)

    def load_extra(self, loader: WeightLoader) -> None:
        mtp_names = [n for n in loader.names if n.startswith(MTP_PREFIX)]
        if not self._mtp_wanted:
            loader.checkpoint.skip([loader.names[n] for n in mtp_names])   # present, not asked for
            return
        if self._mtp_model is None:
            if not mtp_names:
                raise loader.checkpoint.config.invalid(
                    "MTP was asked for but the checkpoint has no MTP weights (no 'mtp_*' tensors); give their "
                    "directory as --speculative-config '{\"method\": \"mtp\", \"model\": PATH}'")
            self._build_mtp(loader)
            return
        loader.checkpoint.skip([loader.names[n] for n in mtp_names])    # the separate directory's are used
        mtp_config = read_checkpoint_config(self._mtp_model)
        mtp_loader = WeightLoader(Checkpoint(mtp_config), self.dtype)
        if not any(n.startswith(MTP_PREFIX) for n in mtp_loader.names):
            raise mtp_config.invalid("no MTP weights (no 'mtp_*' tensors) in the speculative config's 'model'")
        # a copy of the shared embedding / norm / head stored there is not read: the target's are used (FastDeploy
        # borrows them from the main model too)
        mtp_loader.checkpoint.skip([name for n, name in mtp_loader.names.items() if not n.startswith(MTP_PREFIX)])
        self._build_mtp(mtp_loader)
        mtp_loader.finish()

    def _build_mtp(self, loader: WeightLoader) -> None:
        with _unfilled_parameters(), building_precision(self.mtp_precision):   # every parameter is loaded next
            self.mtp = ErnieMTP(self.shape, self.num_target_layers)
        self.mtp.eval()
        if self.dtype != "float32":
            self.mtp.to(dtype=self.dtype)
        self.mtp.load(loader, self.shape)
        self.num_mtp_layers = 1

    def weight_bytes(self) -> int:
        return super().weight_bytes() + (0 if self.mtp is None else stored_weight_bytes(self.mtp))

    def mtp_forward(self, batch: ForwardBatch, prev_hidden: paddle.Tensor, kv: KVCache,
                    rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        if self.mtp is None:
            return super().mtp_forward(batch, prev_hidden, kv, rows)
        self.check_kv(kv)
        if tuple(prev_hidden.shape) != (batch.num_tokens, self.hidden_size):
            raise ValueError(f"{self.ARCHITECTURE}.mtp_forward: argument 'prev_hidden' must be "
                             f"[{batch.num_tokens}, {self.hidden_size}], got {list(prev_hidden.shape)}")
        if batch.num_tokens == 0:
            return (paddle.zeros([0, self.vocab_size], self.dtype), paddle.zeros([0, self.hidden_size], self.dtype))
        net, mtp = self.net, self.mtp
        with paddle.no_grad():
            positions = paddle.to_tensor(batch.positions)
            cos, sin = self.rope.angles(positions, self.dtype)
            hidden = net.norm(prev_hidden.astype(self.dtype))     # FastDeploy: the target's post-final-norm state
            x = mtp.linear_proj(paddle.concat([mtp.emb_norm(net.embed(paddle.to_tensor(batch.token_ids))),
                                               mtp.hidden_norm(hidden)], axis=-1))
            y, residual = mtp.block(x, cos, sin, self.rope, self._attend(batch, kv))
            y = y + residual
            return net.lm_head(net.norm(take_rows(y, rows))), y
