"""A model whose passes cost ~nothing, for measuring the host's work per step (benchmarks/step_overhead.py).

`NullModel.forward` and `mtp_forward` return slices of logits and hidden states made once, so a step's time
minus its passes' time is all host work. It is not registered with `get_model`: only the benchmark and its tests
use it. It reads and writes no KV (nothing of a request's past affects its outputs).

The target's logits rows all choose `TARGET_TOKEN`; the MTP's row r drafts it too, except every fourth row
(r % 4 == 3), which drafts `OTHER_TOKEN`: rounds accept some drafts and reject others, so the verify and
rollback paths both run. Both tokens are printable bytes of the byte tokenizer (never EOS): requests end by
max_tokens.
"""
from __future__ import annotations

import numpy as np
import paddle

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.models.base import ForwardBatch, Model
from fastdeploy.model_executor.models.tokenizer import EOS_ID, VOCAB_SIZE, ByteTokenizer

TARGET_TOKEN = ord("e")
OTHER_TOKEN = ord("a")


class NullModel(Model):
    """Pre-made outputs; `max_rows` is the most packed rows a pass gets (the tables grow if a pass asks more)."""

    def __init__(self, max_rows: int = 1024, dtype: str = "float32"):
        self.name = "null"
        self.tokenizer = ByteTokenizer()
        self.vocab_size = VOCAB_SIZE
        self.eos_token_ids = (EOS_ID,)
        self.hidden_size = 1
        self.dtype = dtype
        self.num_target_layers = 1
        self.num_mtp_layers = 1
        self._build(max_rows)

    def _build(self, rows: int) -> None:
        base = np.tile(-np.arange(self.vocab_size, dtype=self.dtype) / self.vocab_size, (rows, 1))
        target, mtp = base.copy(), base.copy()
        target[:, TARGET_TOKEN] = 1.0
        drafts = np.where(np.arange(rows) % 4 == 3, OTHER_TOKEN, TARGET_TOKEN)
        mtp[np.arange(rows), drafts] = 1.0
        self._rows = rows
        self._target = paddle.to_tensor(target)
        self._mtp = paddle.to_tensor(mtp)
        self._hidden = paddle.zeros([rows, self.hidden_size], self.dtype)

    def kv_layer_tails(self) -> list[tuple[int, ...]]:
        return [(1,), (1,)]

    def _outputs(self, table: paddle.Tensor, batch: ForwardBatch,
                 rows: np.ndarray | None) -> tuple[paddle.Tensor, paddle.Tensor]:
        n = batch.num_tokens
        r = n if rows is None else len(rows)
        if max(n, r) > self._rows:
            self._build(max(n, r, 2 * self._rows))
            table = self._target if table is not self._mtp else self._mtp
        return table[:r], self._hidden[:n]

    def forward(self, batch: ForwardBatch, kv: KVCache,
                rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        return self._outputs(self._target, batch, rows)

    def mtp_forward(self, batch: ForwardBatch, prev_hidden: paddle.Tensor, kv: KVCache,
                    rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        return self._outputs(self._mtp, batch, rows)
