"""The CPU linear kernels (OPS §10) against the time to read their weights: oneDNN's matmul and the project's own
AVX512_BF16 kernel, for bf16, int8 (WINT8) and int4 (WINT4) weights, and the own kernel's float32 beside Paddle's
float32 matmul (MKL), at the row counts of a step (1: batch-1 decode, 2: a K = 1 verify, 16: a batched decode,
256: a prefill chunk).

Each product runs over a stack of layers whose weights together exceed the last-level cache (default: the 18
layers of the ERNIE-4.5-0.3B shape, q|k|v, o, gate|up and down, ~500 MB in float32), one layer after the other as
a forward pass does, so every layer's weights come from memory. "read" is the time to read the same stored bytes
once (benchmarks/weight_read.py: a NumPy sum over a copy in huge pages, on `--threads` threads): what a
memory-bound product cannot beat by much. The table
prints ms per pass over all layers and each kernel's time over the read of its own stored bytes.

A run with other load on the machine is marked (benchmarks/load.py).

Usage: python benchmarks/cpu_linear.py [--rows 1 2 16 256] [--layers 18] [--hidden 1024] [--intermediate 3072]
       [--reps 5] [--threads 1] [--smoke]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.load import LoadMeter, ratio_text  # noqa: E402
from benchmarks.weight_read import weight_reader  # noqa: E402

KINDS = {"float32": 3, "bf16": 0, "int8": 1, "int4": 2}


def layer_shapes(hidden: int, intermediate: int, heads: int = 16, kv_heads: int = 2) -> list[tuple[int, int]]:
    """[in, out] of one decoder layer's projections (ERNIE-4.5-0.3B: head_dim 128, GQA 16 / 2)."""
    head_dim = hidden // heads
    return [(hidden, (heads + 2 * kv_heads) * head_dim), (heads * head_dim, hidden), (hidden, 2 * intermediate),
            (intermediate, hidden)]


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def read_ms(arrays: list[np.ndarray], reps: int, threads: int) -> float:
    return median_ms(weight_reader(arrays, threads), reps)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 16, 256])
    parser.add_argument("--layers", type=int, default=18)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="2 layers of hidden 128: check that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.layers, args.hidden, args.intermediate, args.rows, args.reps = 2, 128, 256, [1, 3], 1
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import paddle
    from fastdeploy.model_executor.layers.quantization.base import (CPU_KERNEL, KERNEL_DPBF16, KERNEL_ONEDNN,
                                                                    cpu_linear, cpu_pack)
    from fastdeploy.model_executor.layers.quantization.weight_only import quantize

    kernels = {"oneDNN": KERNEL_ONEDNN}
    if CPU_KERNEL == KERNEL_DPBF16:
        kernels["own"] = KERNEL_DPBF16
    rng = np.random.default_rng(0)
    shapes = layer_shapes(args.hidden, args.intermediate) * args.layers
    weights = [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]
    meter = LoadMeter()
    meter.start()
    rows = {}   # (kind, kernel) -> {M: ms}; kind -> read ms
    reads = {"float32": read_ms(weights, args.reps, args.threads)}
    dense = [paddle.to_tensor(w) for w in weights]
    inputs = {m: {k: paddle.to_tensor(rng.standard_normal((m, k), dtype=np.float32)) for k, _ in set(shapes)}
              for m in args.rows}
    rows[("float32", "Paddle")] = {m: median_ms(lambda: [paddle.matmul(inputs[m][w.shape[0]], w) for w in dense],
                                                args.reps) for m in args.rows}
    for kind, code in KINDS.items():
        if kind in ("float32", "bf16"):
            sources, scales = weights, [None] * len(weights)
        else:
            quantized = [quantize(w, 8 if kind == "int8" else 4) for w in weights]
            sources, scales = [q for q, _ in quantized], [paddle.to_tensor(s) for _, s in quantized]
        for name, kernel in kernels.items():
            if kind == "float32" and kernel != KERNEL_DPBF16:   # float32 weights are the own kernel's only
                continue
            packed = [cpu_pack(s, code, kernel) for s in sources]
            if kind not in reads:
                reads[kind] = read_ms([p.numpy() for p in packed], args.reps, args.threads)

            def one_pass(m, packed=packed, kernel=kernel):
                for (k, n), p, s in zip(shapes, packed, scales):
                    cpu_linear(inputs[m][k], p, s, k, n, code, kernel)

            rows[(kind, name)] = {m: median_ms(lambda m=m: one_pass(m), args.reps) for m in args.rows}
            del packed
    load = meter.stop()
    stored = {"float32": 4.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}
    params = sum(k * n for k, n in shapes)
    print(f"{args.layers} layers of hidden {args.hidden}, intermediate {args.intermediate} ({params / 1e6:.0f} M "
          f"weights), {args.threads} thread(s); {load.describe()}")
    print("| weights | kernel | read ms | " + " | ".join(f"M={m} ms (÷ read)" for m in args.rows) + " |")
    print("|---|---|---:|" + "---:|" * len(args.rows))
    for (kind, name), times in rows.items():
        read = reads[kind]
        cells = " | ".join(f"{times[m]:.2f} ({ratio_text(times[m] / read, load)})" for m in args.rows)
        print(f"| {kind} ({stored[kind]:g} B) | {name} | {read:.2f} | {cells} |")


if __name__ == "__main__":
    main()
