"""Step time of one fd-tiny forward pass (float32): grouped attention vs the padded reference. Prints a table.

Cases (decode rows query K + 1 = 2 tokens at contexts drawn from 100-400; the prefill chunk is a prompt's first
256 tokens):
  mixed     31 decode rows + one 256-token prefill chunk in one pass
  decode    the 31 decode rows alone
  prefill   the 256-token chunk alone

old       tests/models/padded_attention_ref.py: every sequence padded to the pass's longest query and context
new       fastdeploy/model_executor/layers/paged_attention.py: each group padded to its own
ms        median wall time of `forward` (index prep, both target layers, final norm and LM head), old and new
          alternating in every repetition so that machine load hits both alike
slots     query x context slots the attention matmuls compute, summed over the padded batches
same      logits bit-identical between old and new; otherwise the largest absolute difference

Usage: python benchmarks/attention_step.py [--reps 30] [--seed 0]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import paddle

from benchmarks.load import LoadMeter, load_line
from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers.paged_attention import PagedAttention
from fastdeploy.model_executor.models import get_model
from fastdeploy.model_executor.models.base import ForwardBatch
from tests.models.padded_attention_ref import PaddedFdTiny, PaddedPagedAttention

BLOCK = 16
DECODE_ROWS, QUERY, CHUNK = 31, 2, 256


def make_case(rng: np.random.Generator, contexts: list[int], queries: list[int], model) -> tuple[ForwardBatch,
                                                                                                 KVCache]:
    """A pass in which sequence i queries its last queries[i] positions of contexts[i]; the cache holds seeded
    random K/V at every earlier position, in shuffled blocks."""
    per_seq = -(-max(contexts) // BLOCK)
    num_blocks = per_seq * len(contexts)
    tables = rng.permutation(num_blocks).reshape(len(contexts), per_seq).astype(np.int32)
    kv = model.new_kv_cache(num_blocks, BLOCK)
    for i, layer in enumerate(kv.layers):
        kv.layers[i] = paddle.to_tensor(rng.standard_normal(layer.shape).astype(kv.dtype))
    tokens = rng.integers(0, 256, sum(queries))
    positions = np.concatenate([np.arange(c - q, c) for c, q in zip(contexts, queries)])
    return ForwardBatch(tokens, positions, np.concatenate([[0], np.cumsum(queries)]), tables), kv


def slots(attention) -> int:
    """Query x context slots over the padded batches of one pass."""
    if isinstance(attention, PaddedPagedAttention):
        return attention.num_active * attention.max_q * attention.max_ctx
    return sum(g.num * g.q * g.c for g in attention.groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    new = get_model("fd-tiny")
    old = PaddedFdTiny(new)
    decode_ctx = rng.integers(100, 401, DECODE_ROWS).tolist()
    specs = {"mixed": (decode_ctx + [CHUNK], [QUERY] * DECODE_ROWS + [CHUNK]),
             "decode": (decode_ctx, [QUERY] * DECODE_ROWS), "prefill": ([CHUNK], [CHUNK])}
    cases = {name: make_case(rng, ctx, q, new) for name, (ctx, q) in specs.items()}
    times = {(name, which): [] for name in cases for which in ("old", "new")}
    meter = LoadMeter()
    meter.start()
    for rep in range(args.reps + 1):                  # repetition 0 warms up and is not counted
        for name, (batch, kv) in cases.items():
            for which, model in (("old", old), ("new", new))[::1 if rep % 2 else -1]:
                started = time.perf_counter()
                model.forward(batch, kv)
                if rep:
                    times[name, which].append(time.perf_counter() - started)
    print(f"fd-tiny float32, one forward pass, block size {BLOCK}; median of {args.reps} interleaved repetitions")
    print(f"{'case':<8} {'seqs':>4} {'tokens':>6} {'old ms':>7} {'new ms':>7} {'old/new':>7} "
          f"{'old slots':>10} {'new slots':>10}  same")
    for name, (batch, kv) in cases.items():
        logits = [m.forward(batch, kv)[0].numpy() for m in (old, new)]
        diff = float(np.abs(logits[0] - logits[1]).max())
        same = "yes" if np.array_equal(*logits) else f"no ({diff:.1e})"
        attn_args = (kv, batch.seq_index(), batch.positions, batch.seq_starts, batch.block_tables)
        t_old, t_new = (1e3 * statistics.median(times[name, w]) for w in ("old", "new"))
        print(f"{name:<8} {batch.num_seqs:>4} {batch.num_tokens:>6} {t_old:>7.2f} {t_new:>7.2f} {t_old / t_new:>7.2f} "
              f"{slots(PaddedPagedAttention(*attn_args)):>10} {slots(PagedAttention(*attn_args)):>10}  {same}")
    print(load_line(meter.stop()))


if __name__ == "__main__":
    main()
