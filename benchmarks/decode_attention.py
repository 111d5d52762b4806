"""The CPU decode attention op (`fd_cpu_decode_attention`, OPS §11.1) alone on a real model's attention shape:
one decode step's worth of calls (one per layer, each on its own cache layer), its time and the rate it reads the
context at. Prints a table.

shape       `--shape`: a benchmarks/real_shapes.py shape's attention (ernie-0.3b: 16 query heads over 2 KV heads
            of 128, 18 layers; dense-135m: 9 over 3 of 64, 30 layers); block size 16, each sequence's blocks consecutive in the cache as a fresh batch gets them;
            `--layers` (default: the shape's) cache layers, each read once a step
ms          median over `--reps` steps of the calls' wall time; before each step a `--flush-mib` buffer (1 GiB) is
            read so that the caches come from memory, as they do in a real step after the weights' read
GB/s        the K and V bytes the step reads (every row's context, every KV head) / ms

Compare two builds by running the script with each (`_cpu_linear` swapped), back to back on a quiet machine.

Usage: python benchmarks/decode_attention.py [--shape ernie-0.3b] [--rows 1 16] [--context 160 1000]
    [--cache float32 bfloat16] [--layers 18] [--reps 9] [--threads 1] [--flush-mib 1024]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadMeter, load_line  # noqa: E402
from benchmarks.real_shapes import SHAPES, shape_config  # noqa: E402

BLOCK = 16


def attention_shape(shape: str) -> tuple[int, int, int, int]:
    """(query heads, KV heads, head dim, layers) of a real_shapes.py shape (its MoE with one MoE layer)."""
    c = shape_config(shape, 1, smoke=False)
    return c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["num_hidden_layers"]


def step_ms(shape: str, rows: int, context: int, cache_dtype: str, layers: int, reps: int,
            flush_mib: int) -> tuple[float, float]:
    """(median ms of one step's calls, GB/s of K and V read)."""
    import numpy as np
    import paddle

    from fastdeploy.model_executor.layers import fused_attention

    nh, nkv, hd, _ = attention_shape(shape)
    rng = np.random.default_rng(0)
    per_seq = -(-context // BLOCK)
    caches = [paddle.to_tensor(rng.standard_normal((rows * per_seq, BLOCK, 2, nkv, hd)).astype(np.float32))
              .astype(cache_dtype) for _ in range(layers)]
    ctx_rows = paddle.to_tensor((np.arange(rows * per_seq * BLOCK).reshape(rows, -1)[:, :context]).astype(np.int64))
    token_seq = paddle.to_tensor(np.arange(rows, dtype=np.int32))
    token_len = paddle.to_tensor(np.full(rows, context, np.int32))
    qs = [paddle.to_tensor(rng.standard_normal((rows, nh, hd)).astype(np.float32)) for _ in range(layers)]
    flush = np.ones(flush_mib * 2 ** 18, np.float32)   # read between steps
    times = []
    for _ in range(reps + 1):
        flush.sum()
        started = time.perf_counter()
        for q, cache in zip(qs, caches):
            fused_attention.decode_attention(q, cache, ctx_rows, token_seq, token_len, hd ** -0.5)
        times.append(time.perf_counter() - started)
    ms = statistics.median(times[1:]) * 1e3
    read = layers * rows * context * 2 * nkv * hd * caches[0].element_size()
    return ms, read / ms / 1e6


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="ernie-0.3b")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--context", type=int, nargs="+", default=[160, 1000])
    parser.add_argument("--cache", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--layers", type=int, help="default: the shape's")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--flush-mib", type=int, default=1024)
    args = parser.parse_args(argv)
    nh, nkv, hd, layers = attention_shape(args.shape)
    layers = args.layers or layers
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from fastdeploy.model_executor.layers import fused_attention
    if not fused_attention.AVAILABLE:
        sys.exit("the decode attention op needs the CPU's own AVX-512 kernels (not on this CPU)")
    meter = LoadMeter()
    meter.start()
    print(f"fd_cpu_decode_attention, {args.shape}: {nh}/{nkv} heads of {hd}, {layers} layers a step, "
          f"{args.threads} thread(s)")
    print(f"{'rows':>5} {'context':>8} {'cache':>9} {'ms':>9} {'GB/s':>7}")
    for cache in args.cache:
        for rows in args.rows:
            for context in args.context:
                ms, rate = step_ms(args.shape, rows, context, cache, layers, args.reps, args.flush_mib)
                print(f"{rows:>5} {context:>8} {cache:>9} {ms:>9.2f} {rate:>7.1f}")
    print(load_line(meter.stop()))


if __name__ == "__main__":
    main()
