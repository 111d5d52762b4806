"""What the checkpoint families share: a pre-norm decoder LM over the paged KV cache (`CheckpointLM`) and the
weight loader that maps a checkpoint's tensors onto its parameters (`WeightLoader`).

A family (models/ernie4_5.py, models/qwen3.py, models/ernie4_5_moe.py) is a subclass that reads its shapes from config.json
(`decoder_shape`), may choose each layer's MLP (`build_mlp`) and loads it (`load_mlp`), and names its
tensors. Weight names: `model.` and `ernie.` prefixes are one namespace (FastDeploy renames `model` to `ernie`);
the torch layout stores linear weights `[out, in]` (transposed here), the Paddle layout `[in, out]`; q/k/v and
gate/up are stored separately or fused. A tensor the model does not read, or one it needs and does not find, is
refused by name.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import paddle
from paddle import nn

from fastdeploy.model_executor.layers.quantization import building as building_precision
from fastdeploy.model_executor.layers.decoder import AttentionShape, DecoderLayer, StackOperands, stack_operands
from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.paged_attention import PagedAttention
from fastdeploy.model_executor.layers.rotary import RotaryEmbedding
from fastdeploy.model_executor.layers.transformer import Embedding, Linear, RMSNorm, SwiGLU
from fastdeploy.model_executor.models.base import ForwardBatch, Model, take_rows
from fastdeploy.model_executor.models.checkpoint import Checkpoint, CheckpointConfig
from fastdeploy.precision import Precision, parse_quantization

PREFIXES = ("model.", "ernie.")
_TRANSPOSE_ROWS = 64   # rows per slice of transposed(): a plain a.T copy of a [103424, 1024] table takes 6x longer


def transposed(a: np.ndarray) -> np.ndarray:
    """a.T [cols, rows] as a contiguous copy, in slices of rows that stay in cache (the 0.3B head: 0.6 s, not 3.5)."""
    out = np.empty((a.shape[1], a.shape[0]), a.dtype)
    for start in range(0, a.shape[0], _TRANSPOSE_ROWS):
        out[:, start:start + _TRANSPOSE_ROWS] = a[start:start + _TRANSPOSE_ROWS].T
    return out


@contextlib.contextmanager
def _unfilled_parameters():
    """Parameters created inside start as zeros, not random: every one is then loaded from the checkpoint, and
    Paddle's random init of a 0.3B model's embedding and head alone takes seconds."""
    nn.initializer.set_global_initializer(nn.initializer.Constant(0.0), nn.initializer.Constant(0.0))
    try:
        yield
    finally:
        nn.initializer.set_global_initializer(None)


@dataclass(frozen=True, slots=True)
class DecoderShape:
    """The shapes of a checkpoint's decoder, read from its config.json."""

    vocab_size: int
    num_layers: int
    intermediate_size: int
    attention: AttentionShape
    rope_theta: float
    rope_style: str                # "neox" or "interleaved" (layers/rotary.py)
    tie_word_embeddings: bool

    @property
    def hidden_size(self) -> int:
        return self.attention.hidden_size


def rope_theta(config: CheckpointConfig) -> float:
    """config.json's `rope_theta`, or transformers 5's `rope_parameters.rope_theta`; scaled RoPE is refused."""
    scaling = config.raw.get("rope_scaling")
    if scaling not in (None, {}) and not (isinstance(scaling, dict) and set(scaling) <= {"rope_type", "type"} and
                                         all(v == "default" for v in scaling.values())):
        raise config.invalid(f"config.json: field 'rope_scaling' ({scaling!r}) is not supported (plain RoPE only)")
    params = config.raw.get("rope_parameters")
    if isinstance(params, dict):
        if params.get("rope_type", "default") != "default":
            raise config.invalid(f"config.json: field 'rope_parameters.rope_type' ({params['rope_type']!r}) is not "
                                 f"supported (plain RoPE only)")
        if "rope_theta" in params and "rope_theta" not in config.raw:
            return float(params["rope_theta"])
    return float(config.get("rope_theta", (int, float)))


def common_shape(config: CheckpointConfig, rope_style: str, qk_norm: bool, tie_default: bool,
                 qkv_bias: bool = False) -> DecoderShape:
    """The Llama-like fields every supported family names the same way."""
    act = config.get("hidden_act", str, "silu")
    if act != "silu":
        raise config.invalid(f"config.json: field 'hidden_act' ({act!r}) is not supported (silu only)")
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads", int, heads)
    head_dim = config.get("head_dim", int, hidden // heads)
    if heads % kv_heads:
        raise config.invalid(f"config.json: field 'num_attention_heads' ({heads}) must be a multiple of "
                             f"'num_key_value_heads' ({kv_heads})")
    if head_dim % 2:
        raise config.invalid(f"config.json: field 'head_dim' ({head_dim}) must be even (rotary pairs)")
    eps = float(config.get("rms_norm_eps", (int, float)))
    return DecoderShape(vocab_size=config.vocab_size, num_layers=config.get("num_hidden_layers"),
                        intermediate_size=config.get("intermediate_size"),
                        attention=AttentionShape(hidden, heads, kv_heads, head_dim, qk_norm, eps, qkv_bias),
                        rope_theta=rope_theta(config), rope_style=rope_style,
                        tie_word_embeddings=config.get("tie_word_embeddings", bool, tie_default))


class WeightLoader:
    """Reads a checkpoint's tensors in the engine's layout ([in, out], fused q/k/v and gate/up), each once."""

    def __init__(self, checkpoint: Checkpoint, dtype: str):
        self.checkpoint, self.dtype = checkpoint, dtype
        self.transposed = checkpoint.config.layout == "torch"
        self.names: dict[str, str] = {}   # name with the `model.` prefix -> the checkpoint's own name
        for name in checkpoint.names:
            canonical = self.canonical(name)
            if canonical in self.names:
                raise checkpoint.config.invalid(f"tensor '{name}' and '{self.names[canonical]}' name the same "
                                                f"weight (the 'model.' and 'ernie.' prefixes are one namespace)")
            self.names[canonical] = name

    @staticmethod
    def canonical(name: str) -> str:
        for prefix in PREFIXES[1:]:
            if name.startswith(prefix):
                return PREFIXES[0] + name[len(prefix):]
        return name

    def has(self, name: str) -> bool:
        return name in self.names

    def _name(self, name: str) -> str:
        if name not in self.names:
            raise self.checkpoint.config.invalid(f"tensor '{name}' is missing")
        return self.names[name]

    def vector(self, name: str, size: int) -> np.ndarray:
        return self.checkpoint.tensor(self._name(name), self.dtype, (size,))

    def matrix(self, name: str, rows: int, cols: int) -> np.ndarray:
        """A non-linear matrix stored the same way in both layouts (embedding tables: [vocab, hidden])."""
        return self.checkpoint.tensor(self._name(name), self.dtype, (rows, cols))

    def linear(self, name: str, in_features: int, out_features: int) -> np.ndarray:
        """A linear weight as [in, out], contiguous: the torch layout's [out, in] is transposed."""
        if self.transposed:
            return transposed(self.checkpoint.tensor(self._name(name), self.dtype, (out_features, in_features)))
        return self.checkpoint.tensor(self._name(name), self.dtype, (in_features, out_features))

    def fused_linear(self, fused: str, parts: list[tuple[str, int]], in_features: int) -> np.ndarray:
        """[in, sum of outs]: the fused tensor `fused` when the checkpoint has it, else its parts (name, out)
        concatenated along the output axis in order."""
        if self.has(fused):
            return self.linear(fused, in_features, sum(out for _, out in parts))
        return np.concatenate([self.linear(name, in_features, out) for name, out in parts], axis=1)

    def finish(self) -> None:
        """Refuse the tensors nothing read (named); RoPE's `inv_freq` buffers, which older conversions store and
        transformers recomputes, are not weights and are passed over."""
        self.checkpoint.skip([name for name in self.checkpoint.unread() if name.endswith("rotary_emb.inv_freq")])
        unread = self.checkpoint.unread()
        if unread:
            more = f" (and {len(unread) - 1} more)" if len(unread) > 1 else ""
            raise self.checkpoint.config.invalid(f"tensor '{unread[0]}' is not a weight of "
                                                 f"{self.checkpoint.config.architecture} as config.json describes "
                                                 f"it{more}")


def _assign(param: paddle.Tensor, value: np.ndarray) -> None:
    if tuple(param.shape) != value.shape:   # a model-side bug: the loader checked the checkpoint's shapes
        raise RuntimeError(f"parameter of shape {list(param.shape)} given {list(value.shape)}")
    param.set_value(value)


def load_attention(loader: WeightLoader, layer: DecoderLayer, prefix: str, a: AttentionShape) -> None:
    """A decoder layer's two norms and its attention from tensors `{prefix}input_layernorm.*`,
    `{prefix}post_attention_layernorm.*` and `{prefix}self_attn.*` (its MLP is the family's: load_mlp)."""
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    _assign(layer.attn_norm.weight, loader.vector(prefix + "input_layernorm.weight", a.hidden_size))
    _assign(layer.mlp_norm.weight, loader.vector(prefix + "post_attention_layernorm.weight", a.hidden_size))
    layer.attn.qkv.load_weight(loader.fused_linear(prefix + "self_attn.qkv_proj.weight",
                                                   [(prefix + "self_attn.q_proj.weight", q),
                                                    (prefix + "self_attn.k_proj.weight", kv),
                                                    (prefix + "self_attn.v_proj.weight", kv)], a.hidden_size))
    layer.attn.out.load_weight(loader.linear(prefix + "self_attn.o_proj.weight", q, a.hidden_size))
    if a.qkv_bias:
        fused = prefix + "self_attn.qkv_proj.bias"
        _assign(layer.attn.qkv_bias, loader.vector(fused, q + 2 * kv) if loader.has(fused) else np.concatenate(
            [loader.vector(prefix + f"self_attn.{n}_proj.bias", size) for n, size in (("q", q), ("k", kv), ("v", kv))]))
    if a.qk_norm:
        _assign(layer.attn.q_norm.weight, loader.vector(prefix + "self_attn.q_norm.weight", a.head_dim))
        _assign(layer.attn.k_norm.weight, loader.vector(prefix + "self_attn.k_norm.weight", a.head_dim))


def load_swiglu(loader: WeightLoader, mlp: SwiGLU, prefix: str, hidden: int, intermediate: int) -> None:
    """A SwiGLU MLP from `{prefix}up_gate_proj` (fused) or `{prefix}gate_proj` + `{prefix}up_proj`, and
    `{prefix}down_proj`."""
    mlp.gate_up.load_weight(loader.fused_linear(f"{prefix}up_gate_proj.weight",
                                                [(f"{prefix}gate_proj.weight", intermediate),
                                                 (f"{prefix}up_proj.weight", intermediate)], hidden))
    mlp.down.load_weight(loader.linear(f"{prefix}down_proj.weight", intermediate, hidden))


class DecoderNet(nn.Layer):
    def __init__(self, shape: DecoderShape, mlps: list[nn.Layer]):
        super().__init__()
        self.embed = Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.LayerList([DecoderLayer(i, shape.attention, mlp) for i, mlp in enumerate(mlps)])
        self.norm = RMSNorm(shape.hidden_size, shape.attention.rms_eps)
        # tied: the head is the embedding table, transposed once at load into its own contiguous [H, V]; the
        # lookup reads that one array where the head's storage gives its columns back (Embedding.tie_to)
        self.lm_head = Linear(shape.hidden_size, shape.vocab_size, kind="head")
        if shape.tie_word_embeddings:
            self.embed.tie_to(self.lm_head)
        # a decode or verify pass through every layer as one CPU op (fd_cpu_decoder_stack, OPS §13.4), where the
        # layers allow it: set by the model once its weights are loaded (layers/decoder.stack_operands)
        self.stack: StackOperands | None = None
        self.layers_in_one_op = False


class CheckpointLM(Model):
    """A decoder-only LM loaded from a checkpoint directory, without an MTP module (num_mtp_layers 0; an MTP
    module adds its cache layers after the target's). A family sets ARCHITECTURE and defines decoder_shape; the
    hooks build_mlp / load_mlp / load_extra let it change the MLP or add modules without copying the rest."""

    ARCHITECTURE = ""

    def __init__(self, config: CheckpointConfig, dtype: str = "float32", name: str | None = None,
                 tokenizer=None, quantization=None):
        """dtype and quantization: the precision (fastdeploy/precision.py): how the weights are stored; the
        activations and the KV cache are `self.dtype`, float32 (float64 for a float64 model)."""
        try:
            self.precision = Precision(dtype, parse_quantization(quantization).for_model(self.has_experts()))
        except ValueError as e:
            raise ValueError(f"{self.ARCHITECTURE}: {e}") from None
        self.config = config
        self.shape = self.decoder_shape(config)
        s = self.shape
        self.name = name if name is not None else str(config.path)
        self.tokenizer = tokenizer
        self.vocab_size = s.vocab_size
        self.eos_token_ids = config.eos_token_ids
        self.hidden_size = s.hidden_size
        self.dtype = self.precision.compute_dtype
        self.num_target_layers = s.num_layers
        self.num_mtp_layers = 0
        if any(not 0 <= e < s.vocab_size for e in self.eos_token_ids):
            raise config.invalid(f"EOS ids {list(self.eos_token_ids)} are not all below vocab_size {s.vocab_size}")
        self.rope = RotaryEmbedding(s.attention.head_dim, s.rope_theta, s.rope_style)
        self.check_header_shapes()   # before any parameter is allocated from config.json's sizes
        with _unfilled_parameters(), building_precision(self.precision):
            self.net = DecoderNet(s, [self.build_mlp(i) for i in range(s.num_layers)])
        self.net.eval()
        if self.dtype != "float32":
            self.net.to(dtype=self.dtype)
        self.load(Checkpoint(config))

    def check_header_shapes(self) -> None:
        """Refuse, by tensor name and from the safetensors headers alone, a config.json whose sizes the weights do
        not have: a config with an inflated intermediate_size, num_hidden_layers, vocab_size or hidden_size would
        otherwise allocate its full size before the load finds the mismatch (a memory error, not one line)."""
        s, config = self.shape, self.config
        names = {WeightLoader.canonical(n): n for n in config.tensors}

        def expect(name: str, *shapes: tuple[int, ...]) -> None:
            if name in names and config.tensors[names[name]].shape not in shapes:
                raise config.invalid(f"tensor '{names[name]}' has shape {list(config.tensors[names[name]].shape)}, "
                                     f"the config implies {list(shapes[0])}")

        expect("model.embed_tokens.weight", (s.vocab_size, s.hidden_size))
        last, beyond = f"model.layers.{s.num_layers - 1}.", f"model.layers.{s.num_layers}."
        if not any(n.startswith(last) for n in names) or any(n.startswith(beyond) for n in names):
            layers = {int(n.split(".")[2]) for n in names if n.startswith("model.layers.")}
            raise config.invalid(f"config.json: field 'num_hidden_layers' ({s.num_layers}) does not match the "
                                 f"weights (layers {min(layers, default=0)}..{max(layers, default=-1)})")
        h, i = s.hidden_size, s.intermediate_size
        for n in range(s.num_layers):
            expect(f"model.layers.{n}.mlp.down_proj.weight", (h, i), (i, h))
            expect(f"model.layers.{n}.mlp.up_gate_proj.weight", (h, 2 * i))

    # ---- what a family defines ----

    @classmethod
    def decoder_shape(cls, config: CheckpointConfig) -> DecoderShape:
        raise NotImplementedError

    def has_experts(self) -> bool:
        """Whether some layer's MLP is MoE experts (a plain "wint4" then means FastDeploy's mix_quant)."""
        return False

    def build_mlp(self, layer: int) -> nn.Layer:
        """The MLP of decoder layer `layer` (a hook: MoE families choose per layer)."""
        return SwiGLU(self.shape.hidden_size, self.shape.intermediate_size)

    def load_mlp(self, loader: WeightLoader, layer: int, prefix: str) -> None:
        """Load layer `layer`'s MLP from tensors `{prefix}mlp.*` (prefix = "model.layers.{layer}.")."""
        load_swiglu(loader, self.net.layers[layer].mlp, f"{prefix}mlp.", self.shape.hidden_size,
                    self.shape.intermediate_size)

    # ---- loading ----

    def load(self, checkpoint: Checkpoint) -> None:
        loader = WeightLoader(checkpoint, self.dtype)
        s, a, net = self.shape, self.shape.attention, self.net
        embed = loader.matrix("model.embed_tokens.weight", s.vocab_size, s.hidden_size)
        if not net.embed.is_tied:
            net.embed.load_weight(embed)
        if s.tie_word_embeddings:
            if loader.has("lm_head.weight"):   # some writers store the tied head too: it must be the table
                head = loader.linear("lm_head.weight", s.hidden_size, s.vocab_size)
                if not np.array_equal(head, embed.T):
                    raise checkpoint.config.invalid("config.json: field 'tie_word_embeddings' is true but tensor "
                                                    "'lm_head.weight' differs from 'embed_tokens.weight'")
            net.lm_head.load_weight(transposed(embed))
        else:
            net.lm_head.load_weight(loader.linear("lm_head.weight", s.hidden_size, s.vocab_size))
        _assign(net.norm.weight, loader.vector("model.norm.weight", s.hidden_size))
        for i, layer in enumerate(net.layers):
            p = f"model.layers.{i}."
            load_attention(loader, layer, p, a)
            self.load_mlp(loader, i, p)
        self.load_extra(loader)
        loader.finish()
        net.stack = stack_operands(list(net.layers), self.rope)   # the packed weights exist from here on
        net.layers_in_one_op = net.stack is not None

    def load_extra(self, loader: WeightLoader) -> None:
        """Tensors beyond the target decoder (a hook: ERNIE-4.5 MoE's MTP module)."""

    # ---- the Model interface ----

    def kv_layer_tails(self) -> list[tuple[int, ...]]:
        return [self.shape.attention.kv_tail] * (self.num_target_layers + self.num_mtp_layers)

    def _attend(self, batch: ForwardBatch, kv: KVCache) -> PagedAttention:
        return PagedAttention(kv, batch.seq_index(), batch.positions, batch.seq_starts, batch.block_tables,
                              num_heads=self.shape.attention.num_heads)

    def target_hidden(self, token_ids: paddle.Tensor, positions: paddle.Tensor, attend) -> paddle.Tensor:
        """[M] ids and positions -> the last layer's output [M, H] (before the final norm)."""
        cos, sin = self.rope.angles(positions, self.dtype)
        x, residual = self.net.embed(token_ids), None
        if self.net.layers_in_one_op and getattr(attend, "runs_blocks", False):
            x, residual = attend.decoder_stack(x, self.net.stack, cos, sin)
            return x + residual
        for layer in self.net.layers:
            x, residual = layer(x, cos, sin, self.rope, attend, residual)
        return x + residual

    def forward(self, batch: ForwardBatch, kv: KVCache,
                rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        self.check_kv(kv)
        if batch.num_tokens == 0:
            return (paddle.zeros([0, self.vocab_size], self.dtype), paddle.zeros([0, self.hidden_size], self.dtype))
        with paddle.no_grad():
            hidden = self.target_hidden(paddle.to_tensor(batch.token_ids), paddle.to_tensor(batch.positions),
                                        self._attend(batch, kv))
            return self.net.lm_head(self.net.norm(take_rows(hidden, rows))), hidden

    def mtp_forward(self, batch: ForwardBatch, prev_hidden: paddle.Tensor, kv: KVCache,
                    rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        raise ValueError(f"checkpoint '{self.name}': {self.ARCHITECTURE} has no MTP module (num_mtp_layers 0)")
