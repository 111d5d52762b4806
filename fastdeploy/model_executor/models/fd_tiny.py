"""fd-tiny: a small byte-level decoder-only transformer with one DeepSeek-V3-style MTP module.

Target: embedding, `num_layers` pre-norm blocks (RoPE, multi-head attention over the paged cache, SwiGLU), final
RMSNorm, LM head. MTP module (its own cache layer, after the target's): the input at position p is the target's
hidden state at p and the embedding of the token at p + 1, each RMS-normalised, concatenated, projected back to
the hidden size and passed through one block; its own final RMSNorm and the shared LM head predict the token at
p + 2. Hidden states exchanged with the runner are the residual stream before the final norm.
Weights: weights/fd_tiny.npz (float32, written by scripts/train_fd_tiny.py) and weights/fd_tiny.json (config).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import paddle
from paddle import nn

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.paged_attention import PagedAttention
from fastdeploy.model_executor.layers.transformer import AttendFn, DecoderBlock, Linear, RMSNorm, RopeTable
from fastdeploy.model_executor.models.base import ForwardBatch, Model, take_rows
from fastdeploy.model_executor.models.tokenizer import EOS_ID, VOCAB_SIZE, ByteTokenizer

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
WEIGHTS_PATH = WEIGHTS_DIR / "fd_tiny.npz"


@dataclass(slots=True)
class FdTinyConfig:
    vocab_size: int = VOCAB_SIZE
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 384
    rope_base: float = 10000.0
    rms_eps: float = 1e-6

    def __post_init__(self):
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"FdTinyConfig: field 'num_heads' ({self.num_heads}) must split 'hidden_size' "
                             f"({self.hidden_size}) into heads of even size")


class FdTinyNet(nn.Layer):
    """The parameters and the math, independent of how attention reaches its keys (cache or dense)."""

    def __init__(self, cfg: FdTinyConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.embed = nn.Embedding(cfg.vocab_size, h)
        self.blocks = nn.LayerList([DecoderBlock(i, h, cfg.num_heads, cfg.intermediate_size, cfg.rms_eps)
                                    for i in range(cfg.num_layers)])
        self.norm = RMSNorm(h, cfg.rms_eps)
        self.lm_head = Linear(h, cfg.vocab_size)
        self.mtp_hidden_norm = RMSNorm(h, cfg.rms_eps)
        self.mtp_embed_norm = RMSNorm(h, cfg.rms_eps)
        self.mtp_proj = Linear(2 * h, h)
        self.mtp_block = DecoderBlock(cfg.num_layers, h, cfg.num_heads, cfg.intermediate_size, cfg.rms_eps)
        self.mtp_norm = RMSNorm(h, cfg.rms_eps)
        self.rope = RopeTable(h // cfg.num_heads, cfg.rope_base)

    def _rope(self, positions: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """cos, sin [M, 2, nh, hd / 2], once per pass: full shape, because apply_rope's four products cost several
        times as much broadcast on this CPU (the values are the same: each product is elementwise)."""
        shape = [positions.shape[0], 2, self.cfg.num_heads, self.cfg.hidden_size // self.cfg.num_heads // 2]
        return tuple(paddle.expand(t, shape) for t in self.rope(positions, self.embed.weight.dtype))

    def target_hidden(self, token_ids: paddle.Tensor, positions: paddle.Tensor, attend: AttendFn) -> paddle.Tensor:
        """token_ids, positions [M] int64 -> hidden [M, H]."""
        cos, sin = self._rope(positions)
        x = self.embed(token_ids)
        for block in self.blocks:
            x = block(x, cos, sin, attend)
        return x

    def mtp_hidden(self, prev_hidden: paddle.Tensor, next_ids: paddle.Tensor, positions: paddle.Tensor,
                   attend: AttendFn) -> paddle.Tensor:
        """prev_hidden [M, H] at p, next_ids [M] = token at p + 1, positions [M] = p -> MTP hidden [M, H]."""
        cos, sin = self._rope(positions)
        x = self.mtp_proj(paddle.concat([self.mtp_hidden_norm(prev_hidden),
                                         self.mtp_embed_norm(self.embed(next_ids))], axis=-1))
        return self.mtp_block(x, cos, sin, attend)

    def logits(self, hidden: paddle.Tensor) -> paddle.Tensor:      # [M, H] -> [M, V], next token
        return self.lm_head(self.norm(hidden))

    def mtp_logits(self, hidden: paddle.Tensor) -> paddle.Tensor:  # [M, H] -> [M, V], token at p + 2
        return self.lm_head(self.mtp_norm(hidden))


class FdTiny(Model):
    """fd-tiny behind the Model interface of docs/design.md §3."""

    def __init__(self, net: FdTinyNet, dtype: str = "float32"):
        if dtype not in ("float32", "float64"):
            raise ValueError(f"fd-tiny: argument 'dtype' must be 'float32' or 'float64', got {dtype!r}")
        cfg = net.cfg
        self.net = net
        self.net.eval()
        if dtype != "float32":
            self.net.to(dtype=dtype)
        self.name = "fd-tiny"
        self.tokenizer = ByteTokenizer()
        self.vocab_size = cfg.vocab_size
        self.eos_token_ids = (EOS_ID,)
        self.hidden_size = cfg.hidden_size
        self.dtype = dtype
        self.num_target_layers = cfg.num_layers
        self.num_mtp_layers = 1

    @classmethod
    def from_pretrained(cls, dtype: str = "float32", weights_path: str | Path | None = None) -> "FdTiny":
        """Load the committed weights (or `weights_path`, an .npz with a .json config beside it), cast to dtype."""
        path = Path(weights_path) if weights_path is not None else WEIGHTS_PATH
        if not path.is_file() or not path.with_suffix(".json").is_file():
            raise FileNotFoundError(f"fd-tiny: weights '{path}' or config '{path.with_suffix('.json')}' not found "
                                    f"(run scripts/train_fd_tiny.py)")
        cfg = FdTinyConfig(**json.loads(path.with_suffix(".json").read_text()))
        net = FdTinyNet(cfg)
        with np.load(path) as arrays:
            state = {name: arrays[name] for name in arrays.files}
        expected = set(net.state_dict())
        if set(state) != expected:
            raise ValueError(f"fd-tiny: weights '{path}' do not match the config: missing "
                             f"{sorted(expected - set(state))}, unexpected {sorted(set(state) - expected)}")
        net.set_state_dict({name: paddle.to_tensor(value) for name, value in state.items()})
        return cls(net, dtype)

    def kv_layer_tails(self) -> list[tuple[int, ...]]:
        cfg = self.net.cfg
        tail = (2, cfg.num_heads, cfg.hidden_size // cfg.num_heads)   # K and V of every head
        return [tail] * (cfg.num_layers + 1)

    @staticmethod
    def _attend(batch: ForwardBatch, kv: KVCache) -> PagedAttention:
        return PagedAttention(kv, batch.seq_index(), batch.positions, batch.seq_starts, batch.block_tables)

    def _empty(self) -> tuple[paddle.Tensor, paddle.Tensor]:
        return (paddle.zeros([0, self.vocab_size], self.dtype), paddle.zeros([0, self.hidden_size], self.dtype))

    def forward(self, batch: ForwardBatch, kv: KVCache,
                rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        self.check_kv(kv)
        if batch.num_tokens == 0:
            return self._empty()
        with paddle.no_grad():
            hidden = self.net.target_hidden(paddle.to_tensor(batch.token_ids), paddle.to_tensor(batch.positions),
                                            self._attend(batch, kv))
            return self.net.logits(take_rows(hidden, rows)), hidden

    def mtp_forward(self, batch: ForwardBatch, prev_hidden: paddle.Tensor, kv: KVCache,
                    rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        self.check_kv(kv)
        if tuple(prev_hidden.shape) != (batch.num_tokens, self.hidden_size):
            raise ValueError(f"fd-tiny.mtp_forward: argument 'prev_hidden' must be [{batch.num_tokens}, "
                             f"{self.hidden_size}], got {list(prev_hidden.shape)}")
        if batch.num_tokens == 0:
            return self._empty()
        with paddle.no_grad():
            # the MTP block is built as layer `num_layers`, which is exactly its cache layer index
            hidden = self.net.mtp_hidden(prev_hidden.astype(self.dtype), paddle.to_tensor(batch.token_ids),
                                         paddle.to_tensor(batch.positions), self._attend(batch, kv))
            return self.net.mtp_logits(take_rows(hidden, rows)), hidden


def save_weights(net: FdTinyNet, path: str | Path) -> None:
    """Write the parameters as float32 .npz and the config as .json beside it."""
    path = Path(path)
    np.savez(path, **{name: t.numpy().astype(np.float32) for name, t in net.state_dict().items()})
    path.with_suffix(".json").write_text(json.dumps(asdict(net.cfg), indent=2) + "\n")
