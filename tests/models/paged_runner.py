"""Minimal drivers of the Model interface for the model tests: pack sequences, prefill, decode greedily."""
from __future__ import annotations

import numpy as np

from fastdeploy.model_executor.models.base import ForwardBatch


def scattered_tables(rng: np.random.Generator, num_seqs: int, blocks_per_seq: int, num_blocks: int) -> np.ndarray:
    """[num_seqs, blocks_per_seq] int32 of distinct, shuffled block ids (so no sequence sees contiguous blocks)."""
    ids = rng.permutation(num_blocks)[:num_seqs * blocks_per_seq]
    return ids.reshape(num_seqs, blocks_per_seq).astype(np.int32)


def packed_batch(chunks: list[list[int]], starts: list[int], tables: np.ndarray) -> ForwardBatch:
    """One ForwardBatch: sequence i contributes tokens chunks[i] at positions starts[i], starts[i] + 1, ..."""
    tokens = np.concatenate([np.asarray(c, np.int64) for c in chunks])
    positions = np.concatenate([np.arange(s, s + len(c)) for c, s in zip(chunks, starts)])
    seq_starts = np.concatenate([[0], np.cumsum([len(c) for c in chunks])])
    return ForwardBatch(tokens, positions, seq_starts, tables)


def greedy_decode(model, kv, prompt: list[int], table: np.ndarray, steps: int) -> list[int]:
    """Prefill `prompt` in one pass, then feed the argmax back one token per pass; returns the `steps` tokens."""
    logits, _ = model.forward(packed_batch([prompt], [0], table[None]), kv)
    out = [int(logits.numpy()[-1].argmax())]
    while len(out) < steps:
        logits, _ = model.forward(packed_batch([[out[-1]]], [len(prompt) + len(out) - 1], table[None]), kv)
        out.append(int(logits.numpy()[-1].argmax()))
    return out
