"""Float32 CPU GEMM speed of Paddle's bundled MKL, with its default CPU dispatch and with MKL_DEBUG_CPU_TYPE=5
(the AVX2 kernels, which `import fastdeploy` selects on AMD processors), against torch's and NumPy's, on the
products one engine step makes (docs/benchmarks.md "Real shapes").

Each library runs in its own subprocess (MKL reads the variable once, at its first call; torch never shares a
process with paddle). For each row count M it times an [M, K] x [K, N] product (default: the ERNIE-4.5-0.3B
MLP's 1024 x 3072; M = 1 is a batch-1 decode, 2 a K = 1 verify, 16 a batched decode, 256 a prefill chunk) and
prints one table: milliseconds and GFLOP/s per library, and the ratios, with `*` where row 0 of the product
differs in its bits from the same row multiplied alone (M = 1): a kernel whose rounding depends on the row count,
which makes a prefix-cache hit or another batch shape change logprobs within tolerance rather than not at all.
A run with other load on the machine is marked (benchmarks/load.py).

Usage: python benchmarks/cpu_gemm.py [--rows 1 2 16 256] [--k 1024] [--n 3072] [--threads 1] [--reps 20]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import LoadMeter, ratio_text  # noqa: E402

CHILD = r"""
import json, sys, time
import numpy as np
library, rows, k, n, threads, reps = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:])
if library.startswith("paddle"):
    import paddle
    paddle.set_device("cpu")
    operand = paddle.to_tensor
    product = paddle.matmul
elif library == "torch":
    import torch
    torch.set_num_threads(threads)
    operand = torch.from_numpy
    product = torch.matmul
else:
    operand = np.asarray
    product = np.matmul
rng = np.random.default_rng(0)
b = operand(rng.random((k, n), dtype=np.float32))
a_all = rng.random((max(rows), k), dtype=np.float32)
first_row = np.asarray(product(operand(a_all[:1].copy()), b))[0]
out = {}
for m in rows:
    a = operand(a_all[:m].copy())
    same = bool((np.asarray(product(a, b))[0] == first_row).all())   # row 0's bits independent of M?
    start = time.perf_counter()
    for _ in range(reps):
        product(a, b)
    out[m] = [(time.perf_counter() - start) / reps * 1e3, same]
print(json.dumps(out))
"""

LIBRARIES = {   # name -> MKL_DEBUG_CPU_TYPE in its environment (None: unset)
    "paddle (MKL default dispatch)": None,
    "paddle (MKL AVX2, as fastdeploy sets it on AMD)": "5",
    "torch": None,
    "numpy": None,
}


def run(library: str, debug_cpu_type: str | None, args) -> dict[int, tuple[float, bool]]:
    env = {k: v for k, v in os.environ.items() if k != "MKL_DEBUG_CPU_TYPE"}
    env.update(OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    if debug_cpu_type is not None:
        env["MKL_DEBUG_CPU_TYPE"] = debug_cpu_type
    done = subprocess.run([sys.executable, "-c", CHILD, library.split()[0], json.dumps(args.rows), str(args.k),
                           str(args.n), str(args.threads), str(args.reps)], env=env, capture_output=True,
                          text=True, check=True)
    return {int(m): (ms, same) for m, (ms, same) in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 16, 256])
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--n", type=int, default=3072)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    meter = LoadMeter()
    meter.start()
    times = {}
    for library, debug in LIBRARIES.items():
        print(f"timing {library} ...", file=sys.stderr, flush=True)
        times[library] = run(library, debug, args)
    load = meter.stop()
    print(f"[M, {args.k}] x [{args.k}, {args.n}] float32, {args.threads} thread(s); {load.describe()}; "
          "* = row 0's bits differ from the row multiplied alone")
    names = list(LIBRARIES)
    print("| M | " + " | ".join(f"{name}: ms (GFLOP/s)" for name in names)
          + " | default ms / AVX2 ms | torch ms / paddle AVX2 ms |")
    print("|---:|" + "---:|" * (len(names) + 2))
    for m in args.rows:
        gflop = 2 * m * args.k * args.n / 1e9
        cells = [f"{ms:.3f} ({gflop / ms * 1e3:.1f}){'' if same else ' *'}"
                 for ms, same in (times[name][m] for name in names)]
        speedup = times[names[0]][m][0] / times[names[1]][m][0]
        against_torch = times["torch"][m][0] / times[names[1]][m][0]
        ratios = f" | {ratio_text(speedup, load)} x | {ratio_text(against_torch, load)} x |"
        print(f"| {m} | " + " | ".join(cells) + ratios)


if __name__ == "__main__":
    main()
