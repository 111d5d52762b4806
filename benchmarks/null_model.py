"""A model whose passes cost ~nothing, for measuring the host's work per step (benchmarks/step_overhead.py).

`NullModel.forward` and `mtp_forward` return logits and hidden states made once per shape, so a step's time
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
    """Pre-made outputs: a pass that asks for R logits rows gets a contiguous [R, V] tensor made on first use for
    that R (a slice of one larger table would not do: Paddle's .numpy() of a slice copies the whole table, so the
    host's copy of the logits would cost what the table's size says, not what R's does)."""

    def __init__(self, dtype: str = "float32"):
        self.name = "null"
        self.tokenizer = ByteTokenizer()
        self.vocab_size = VOCAB_SIZE
        self.eos_token_ids = (EOS_ID,)
        self.hidden_size = 1
        self.dtype = dtype
        self.num_target_layers = 1
        self.num_mtp_layers = 1
        self._target: dict[int, paddle.Tensor] = {}
        self._mtp: dict[int, paddle.Tensor] = {}
        self._hidden: dict[int, paddle.Tensor] = {}

    def kv_layer_tails(self) -> list[tuple[int, ...]]:
        return [(1,), (1,)]

    def _logits(self, rows: int, mtp: bool) -> paddle.Tensor:
        table = self._mtp if mtp else self._target
        if rows not in table:
            logits = np.tile(-np.arange(self.vocab_size, dtype=self.dtype) / self.vocab_size, (rows, 1))
            chosen = np.full(rows, TARGET_TOKEN)
            if mtp:
                chosen[np.arange(rows) % 4 == 3] = OTHER_TOKEN
            logits[np.arange(rows), chosen] = 1.0
            table[rows] = paddle.to_tensor(logits)
        return table[rows]

    def _outputs(self, mtp: bool, batch: ForwardBatch,
                 rows: np.ndarray | None) -> tuple[paddle.Tensor, paddle.Tensor]:
        n = batch.num_tokens
        if n not in self._hidden:
            self._hidden[n] = paddle.zeros([n, self.hidden_size], self.dtype)
        return self._logits(n if rows is None else len(rows), mtp), self._hidden[n]

    def forward(self, batch: ForwardBatch, kv: KVCache,
                rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        return self._outputs(False, batch, rows)

    def mtp_forward(self, batch: ForwardBatch, prev_hidden: paddle.Tensor, kv: KVCache,
                    rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        return self._outputs(True, batch, rows)
