"""In-process engine throughput with Intel OpenMP's workers spinning after each parallel region (KMP_BLOCKTIME=200,
Intel's default) against sleeping at once (KMP_BLOCKTIME=0, what `import fastdeploy` sets unless the user did):
the ERNIE-4.5-0.3B shape with random weights (benchmarks/real_shapes.py writes it), `LLM.generate` with greedy
requests of `--prompt` random tokens and `--new-tokens` forced new ones, C at a time, for each OMP_NUM_THREADS.

Why it matters (fastdeploy/__init__.py): Paddle's wheel loads two OpenMP runtimes, Intel's for its MKL and GCC's
for its own kernels, oneDNN and the project's CPU ops; with as many threads as cores, Intel's spinning workers take
the cores GCC's team needs. Each cell runs in a fresh process (the block time is read once per process).

    python benchmarks/openmp_blocktime.py [--precision wint8] [--threads 1 2] [--concurrency 1 16] [--prompt 64]
        [--new-tokens 32]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.load import LoadMeter, LoadReading, load_line, ratio_text  # noqa: E402
from benchmarks.real_shapes import PRECISIONS, shape_config, write_checkpoint  # noqa: E402

CELL = """
import json, sys
sys.path.insert(0, {repo!r})
from benchmarks.real_shapes import engine_throughput
print(json.dumps([engine_throughput({path!r}, 0, c, {prompt}, {new_tokens}, {precision!r}) for c in {cs!r}]))
"""


def cell(path: str, threads: int, blocktime: int, args) -> tuple[list[float], LoadReading]:
    """Tokens/s at each concurrency in a fresh process, and the load reading of that run."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), KMP_BLOCKTIME=str(blocktime))
    code = CELL.format(repo=str(REPO), path=path, prompt=args.prompt, new_tokens=args.new_tokens,
                       precision=args.precision, cs=list(args.concurrency))
    meter = LoadMeter()
    meter.start()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1]), meter.stop()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=list(PRECISIONS), default="wint8")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--smoke", action="store_true", help="tiny dimensions: check that the script runs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fd-blocktime-") as tmp:
        write_checkpoint(Path(tmp), shape_config("ernie-0.3b", 1, args.smoke), 0)
        print(f"ERNIE-4.5-0.3B shape{' (smoke)' if args.smoke else ''}, {args.precision}, prompts of {args.prompt} "
              f"tokens, {args.new_tokens} new, in-process LLM.generate")
        print("| OMP_NUM_THREADS | C | tok/s, KMP_BLOCKTIME=200 | tok/s, KMP_BLOCKTIME=0 | 0 ÷ 200 |")
        print("|---:|---:|---:|---:|---:|")
        meter = LoadMeter()
        meter.start()
        for threads in args.threads:
            spinning, spin_load = cell(tmp, threads, 200, args)
            sleeping, sleep_load = cell(tmp, threads, 0, args)
            for c, a, b in zip(args.concurrency, spinning, sleeping):
                print(f"| {threads} | {c} | {a:.2f} | {b:.2f} | {ratio_text(b / a, spin_load, sleep_load)} |",
                      flush=True)
        print(load_line(meter.stop()))


if __name__ == "__main__":
    main()
