"""fd-toy: a deterministic integer model whose every output is a hash of the context read back from the KV cache.

PD_MTP_FLOW §10.3. The target's cache layer stores the token id at each position; the next token is a function
of the whole context 0..p (a polynomial hash over the cache contents, then a 64-bit mixer), so a lost, stale or
misplaced block changes the output. The MTP module's cache layer stores, at position p, the pair it was fed
(token at p, recovered from the target hidden, and token at p + 1); it rebuilds the context 0..p+1 from its own
cache and drafts the target's prediction for p + 2 with a pseudo-random agreement rate `mtp_agreement`, otherwise
the target's second choice. Being pure functions of the context, single-instance and PD runs agree exactly.

Token ids follow the byte tokenizer: predictions are EOS (rate `eos_rate`), one of a few frequent bytes
(" ", "e", "a": stop sequences can be built from them) or a printable ASCII byte. The target's second choice is
never EOS, so suppressing EOS for min_tokens picks a deterministic printable token.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import paddle

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.models.base import ForwardBatch, Model
from fastdeploy.model_executor.models.tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE, ByteTokenizer

_MULT = 0x9E3779B97F4A7C15            # odd, hence invertible modulo 2^64
_MULT_INV = pow(_MULT, -1, 1 << 64)
_TARGET_SALT = 0x5851F42D4C957F2D
_MTP_SALT = 0x14057B7EF767814F
FREQUENT_TOKENS = (ord(" "), ord("e"), ord("a"))
FREQUENT_RATE = 0.3                   # total probability of the frequent tokens (outside EOS)
_PRINTABLE_LO, _NUM_PRINTABLE = 32, 95


def _u64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.uint64)


def _mix64(h: np.ndarray, salt: int) -> np.ndarray:
    """splitmix64 finalizer of h XOR salt, elementwise on uint64 (wrap-around arithmetic)."""
    x = _u64(h) ^ _u64(salt)
    x = (x ^ (x >> _u64(30))) * _u64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _u64(27))) * _u64(0x94D049BB133111EB)
    return x ^ (x >> _u64(31))


class _Powers:
    """MULT^q and MULT^-q modulo 2^64 for q < n, grown on demand."""

    def __init__(self):
        self.pow = np.ones(1, np.uint64)
        self.inv = np.ones(1, np.uint64)

    @staticmethod
    def _cumulative_powers(base: int, size: int) -> np.ndarray:
        factors = np.full(size, base, dtype=np.uint64)
        factors[0] = 1
        return np.cumprod(factors, dtype=np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if n > self.pow.size:
            size = max(n, 2 * self.pow.size)
            self.pow = self._cumulative_powers(_MULT, size)
            self.inv = self._cumulative_powers(_MULT_INV, size)
        return self.pow[:n], self.inv[:n]


_POWERS = _Powers()


def prefix_hashes(tokens: np.ndarray) -> np.ndarray:
    """[C] uint64: H[p] = sum_{q <= p} (tokens[q] + 1) * MULT^(p - q) mod 2^64, for every prefix at once."""
    tokens = np.asarray(tokens, dtype=np.int64)
    pw, inv = _POWERS.get(tokens.size)
    return pw * np.cumsum((tokens.astype(np.uint64) + _u64(1)) * inv, dtype=np.uint64)


def extend_hash(h: np.ndarray, token: np.ndarray) -> np.ndarray:
    """Hash of a prefix extended by one token (same polynomial as prefix_hashes)."""
    return _u64(h) * _u64(_MULT) + (np.asarray(token, dtype=np.int64).astype(np.uint64) + _u64(1))


class FdToy(Model):
    """Deterministic toy target + MTP head over a paged cache. See the module docstring."""

    def __init__(self, dtype: str = "float32", eos_rate: float = 0.04, mtp_agreement: float = 0.7):
        if dtype not in ("float32", "float64"):
            raise ValueError(f"fd-toy: argument 'dtype' must be 'float32' or 'float64', got {dtype!r}")
        if not 0.0 <= eos_rate <= 1.0 - FREQUENT_RATE:
            raise ValueError(f"fd-toy: argument 'eos_rate' must be in [0, {1 - FREQUENT_RATE}], got {eos_rate!r}")
        if not 0.0 <= mtp_agreement <= 1.0:
            raise ValueError(f"fd-toy: argument 'mtp_agreement' must be in [0, 1], got {mtp_agreement!r}")
        self.name = "fd-toy"
        self.tokenizer = ByteTokenizer()
        self.vocab_size = VOCAB_SIZE
        self.eos_token_ids = (EOS_ID,)
        self.hidden_size = 1          # the hidden state is the token id at that position
        self.dtype = dtype
        self.num_target_layers = 1
        self.num_mtp_layers = 1
        self.eos_rate = float(eos_rate)
        self.mtp_agreement = float(mtp_agreement)

    def kv_layer_tails(self) -> list[tuple[int, ...]]:
        # target: token id at p; MTP: (token at p, token at p + 1)
        return [(1,), (2,)]

    # ---- decision rules, shared by the cache-reading passes and the pure reference functions ----

    def _choices(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Target prediction and second choice [M] int64 for context hashes h [M]."""
        x = _mix64(h, _TARGET_SALT)
        u = (x >> _u64(11)).astype(np.float64) * 2.0 ** -53
        printable = (_PRINTABLE_LO + (x >> _u64(7)) % _u64(_NUM_PRINTABLE)).astype(np.int64)
        pick = ((x >> _u64(3)) % _u64(len(FREQUENT_TOKENS))).astype(np.int64)
        frequent = np.asarray(FREQUENT_TOKENS, np.int64)[pick]
        pred = np.where(u < self.eos_rate, EOS_ID, np.where(u < self.eos_rate + FREQUENT_RATE, frequent, printable))
        second = (_PRINTABLE_LO + (x >> _u64(17)) % _u64(_NUM_PRINTABLE)).astype(np.int64)
        second = np.where(second == pred, _PRINTABLE_LO + (second - _PRINTABLE_LO + 1) % _NUM_PRINTABLE, second)
        return pred, second

    def _mtp_agrees(self, h: np.ndarray) -> np.ndarray:
        x = _mix64(h, _MTP_SALT)
        return (x >> _u64(11)).astype(np.float64) * 2.0 ** -53 < self.mtp_agreement

    def _logits(self, h: np.ndarray, top: np.ndarray, second: np.ndarray) -> np.ndarray:
        """[M, V]: top scores 2, second 1, every other id a distinct value <= 0 (a hash-seeded permutation)."""
        v = np.arange(self.vocab_size, dtype=np.int64)
        shift = (_u64(h) % _u64(self.vocab_size)).astype(np.int64)
        logits = -((v[None, :] * 97 + shift[:, None]) % self.vocab_size).astype(np.float64)
        rows = np.arange(logits.shape[0])
        logits[rows, top] = 2.0
        logits[rows, second] = 1.0
        return logits

    # ---- cache-reading passes ----

    def _read_sequence(self, kv: KVCache, layer: int, batch: ForwardBatch, seq: int, length: int) -> np.ndarray:
        """[length, *tail] int64: what `layer` holds at positions 0..length-1 of sequence `seq`."""
        blocks, offsets = kv.locate(batch.block_tables, np.full(length, seq), np.arange(length))
        return np.rint(kv.read(layer, blocks, offsets).numpy()).astype(np.int64)

    def _to_tensor(self, a: np.ndarray) -> paddle.Tensor:
        return paddle.to_tensor(a.astype(self.dtype))

    def forward(self, batch: ForwardBatch, kv: KVCache,
                rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        self.check_kv(kv)
        blocks, offsets = kv.locate(batch.block_tables, batch.seq_index(), batch.positions)
        kv.write(0, blocks, offsets, self._to_tensor(batch.token_ids[:, None]))
        hashes = np.zeros(batch.num_tokens, np.uint64)
        for s in range(batch.num_seqs):
            lo, hi = batch.seq_starts[s], batch.seq_starts[s + 1]
            if lo == hi:
                continue
            pos = batch.positions[lo:hi]
            context = self._read_sequence(kv, 0, batch, s, int(pos.max()) + 1)[:, 0]
            hashes[lo:hi] = prefix_hashes(context)[pos]
        pred, second = self._choices(hashes)
        picked = slice(None) if rows is None else np.asarray(rows, np.int64)
        logits = self._logits(hashes[picked], pred[picked], second[picked])
        return self._to_tensor(logits), self._to_tensor(batch.token_ids[:, None])

    def mtp_forward(self, batch: ForwardBatch, prev_hidden: paddle.Tensor, kv: KVCache,
                    rows: np.ndarray | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        self.check_kv(kv)
        if tuple(prev_hidden.shape) != (batch.num_tokens, self.hidden_size):
            raise ValueError(f"fd-toy.mtp_forward: argument 'prev_hidden' must be [{batch.num_tokens}, "
                             f"{self.hidden_size}], got {list(prev_hidden.shape)}")
        token_at_p = np.rint(prev_hidden.numpy()[:, 0]).astype(np.int64)
        blocks, offsets = kv.locate(batch.block_tables, batch.seq_index(), batch.positions)
        kv.write(1, blocks, offsets, self._to_tensor(np.stack([token_at_p, batch.token_ids], axis=1)))
        hashes = np.zeros(batch.num_tokens, np.uint64)
        for s in range(batch.num_seqs):
            lo, hi = batch.seq_starts[s], batch.seq_starts[s + 1]
            if lo == hi:
                continue
            pos = batch.positions[lo:hi]
            pairs = self._read_sequence(kv, 1, batch, s, int(pos.max()) + 1)
            hashes[lo:hi] = extend_hash(prefix_hashes(pairs[:, 0])[pos], pairs[pos, 1])
        pred, second = self._choices(hashes)
        agree = self._mtp_agrees(hashes)
        top, runner_up = np.where(agree, pred, second), np.where(agree, second, pred)
        picked = slice(None) if rows is None else np.asarray(rows, np.int64)
        logits = self._logits(hashes[picked], top[picked], runner_up[picked])
        return self._to_tensor(logits), self._to_tensor(batch.token_ids[:, None])

    # ---- pure reference functions (no cache, no engine) for tests ----

    def target_choices(self, context: Sequence[int]) -> tuple[int, int]:
        """(prediction, second choice) of the target for the token after `context`."""
        h = prefix_hashes(np.asarray(context, np.int64))[-1:]
        pred, second = self._choices(h)
        return int(pred[0]), int(second[0])

    def mtp_draft(self, context: Sequence[int]) -> int:
        """The MTP draft for the token after `context` (context = tokens 0..p+1, the draft is for p + 2)."""
        h = prefix_hashes(np.asarray(context, np.int64))[-1:]
        pred, second = self._choices(h)
        return int(pred[0] if self._mtp_agrees(h)[0] else second[0])

    def greedy_generate(self, prompt: Sequence[int], max_new_tokens: int, min_tokens: int = 0) -> list[int]:
        """Greedy output of the target alone; EOS ends it (included) and is suppressed at output index i
        while i + 1 < min_tokens (PD_MTP_FLOW §10.2)."""
        context, out = list(prompt), []
        while len(out) < max_new_tokens:
            pred, second = self.target_choices(context)
            token = second if pred == EOS_ID and len(out) + 1 < min_tokens else pred
            out.append(token)
            context.append(token)
            if token == EOS_ID:
                break
        return out

    def find_prompt(self, eos_index: int, prompt_len: int, seed: int, max_tries: int = 100_000) -> list[int]:
        """A prompt (BOS + printable bytes, `prompt_len` ids in all) whose greedy output's first EOS is at
        output index `eos_index` (0 = the first generated token). Deterministic in `seed`."""
        rng = np.random.default_rng(seed)
        for _ in range(max_tries):
            prompt = [BOS_ID, *rng.integers(_PRINTABLE_LO, _PRINTABLE_LO + _NUM_PRINTABLE, prompt_len - 1).tolist()]
            out = self.greedy_generate(prompt, eos_index + 1)
            if len(out) == eos_index + 1 and out[-1] == EOS_ID:
                return prompt
        raise RuntimeError(f"fd-toy.find_prompt: no prompt with EOS at index {eos_index} in {max_tries} tries")
