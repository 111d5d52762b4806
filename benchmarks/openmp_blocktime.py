"""In-process engine throughput under the two OpenMP runtimes Paddle's wheel loads, two comparisons:

`--compare blocktime` (the default): Intel OpenMP's workers spinning after each parallel region (KMP_BLOCKTIME=200,
Intel's default) against sleeping at once (KMP_BLOCKTIME=0, what `import fastdeploy` sets unless the user did).
`--compare norm`: the layers' RMSNorm through Paddle's `fused_rms_norm`, which opens an Intel OpenMP region per
call, against the project's own op (OPS §12, the default), which runs on GCC's runtime like the other CPU ops; both
at KMP_BLOCKTIME=0.

The ERNIE-4.5-0.3B shape with random weights (benchmarks/real_shapes.py writes it), `LLM.generate` with greedy
requests of `--prompt` random tokens and `--new-tokens` forced new ones, C at a time, for each OMP_NUM_THREADS.

Why it matters (fastdeploy/__init__.py): Paddle's wheel loads two OpenMP runtimes, Intel's for its MKL and its own
kernels, GCC's for the project's CPU ops; with as many threads as cores, one runtime's spinning or waking workers
take the cores the other's team needs. Each cell runs in a fresh process (the block time is read once per process).

    python benchmarks/openmp_blocktime.py [--compare blocktime|norm] [--precision wint8] [--threads 1 2]
        [--concurrency 1 16] [--prompt 64] [--new-tokens 32]
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
{prelude}
from benchmarks.real_shapes import engine_throughput
print(json.dumps([engine_throughput({path!r}, 0, c, {prompt}, {new_tokens}, {precision!r}) for c in {cs!r}]))
"""


PADDLE_NORM = "from fastdeploy.model_executor.layers import cpu_rms_norm\ncpu_rms_norm.AVAILABLE = False"
# --compare: the table's two column names and each column's (KMP_BLOCKTIME, code run before the engine)
COMPARISONS = {
    "blocktime": (("KMP_BLOCKTIME=200", (200, "")), ("KMP_BLOCKTIME=0", (0, "")), "0 ÷ 200"),
    "norm": (("Paddle's fused_rms_norm", (0, PADDLE_NORM)), ("fd_cpu_rms_norm", (0, "")), "own ÷ Paddle's"),
}


def cell(path: str, threads: int, blocktime: int, prelude: str, args) -> tuple[list[float], LoadReading]:
    """Tokens/s at each concurrency in a fresh process (`prelude` run first), and the load reading of that run."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), KMP_BLOCKTIME=str(blocktime))
    code = CELL.format(repo=str(REPO), prelude=prelude, path=path, prompt=args.prompt, new_tokens=args.new_tokens,
                       precision=args.precision, cs=list(args.concurrency))
    meter = LoadMeter()
    meter.start()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1]), meter.stop()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", choices=list(COMPARISONS), default="blocktime")
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
        (name_a, config_a), (name_b, config_b), ratio_name = COMPARISONS[args.compare]
        print(f"| OMP_NUM_THREADS | C | tok/s, {name_a} | tok/s, {name_b} | {ratio_name} |")
        print("|---:|---:|---:|---:|---:|")
        meter = LoadMeter()
        meter.start()
        for threads in args.threads:
            first, first_load = cell(tmp, threads, *config_a, args)
            second, second_load = cell(tmp, threads, *config_b, args)
            for c, a, b in zip(args.concurrency, first, second):
                print(f"| {threads} | {c} | {a:.2f} | {b:.2f} | {ratio_text(b / a, first_load, second_load)} |",
                      flush=True)
        print(load_line(meter.stop()))


if __name__ == "__main__":
    main()
