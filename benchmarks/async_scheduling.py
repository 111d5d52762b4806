"""Whether async scheduling pays on this CPU (docs/design.md §10): the in-process engine with and without it, same
workload, runs interleaved, side by side.

For each case (model, concurrency C, MTP K): C greedy requests of `--prompt` tokens and `--new-tokens` new tokens
(`ignore_eos`, so every run does the same work) through `LLM.generate`, `--reps` times each way, alternating. The
table gives each way's best tokens/s, the ratio async ÷ sequential, the CPU seconds per output token of this
process (all threads: what the overlap costs in work, not in wall time), and the load column
(benchmarks/load.py). Models: fd-tiny (embedded; its passes are short, so the host's share of a step is large)
and `ernie-0.3b` (benchmarks/real_shapes.py's ERNIE-4.5-0.3B shape, random weights, written to a temporary
directory). The model runs `--threads` threads (OMP_NUM_THREADS); the engine's host work runs beside it on the
main thread while the runner thread computes.

Usage: python benchmarks/async_scheduling.py [--cases fd-tiny:16:0 fd-tiny:16:1 fd-tiny:64:1 ernie-0.3b:16:0]
       [--prompt 32] [--new-tokens 64] [--reps 3] [--threads 1] [--smoke]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.load import LoadMeter, ratio_text  # noqa: E402


def workload(vocab: int, concurrency: int, prompt_len: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, prompt_len).tolist() for _ in range(concurrency)]


def run_once(llm, prompts: list[list[int]], new_tokens: int) -> tuple[float, float, int]:
    """(wall seconds, this process's CPU seconds, output tokens) of one generate call."""
    from fastdeploy import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    wall, cpu = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - wall, time.process_time() - cpu, sum(len(o.outputs.token_ids) for o in outputs)


def run_case(model: str, concurrency: int, k: int, args) -> str:
    from fastdeploy import LLM

    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    engine = dict(model=model, speculative_config=spec, max_num_seqs=concurrency, block_size=16,
                  max_model_len=args.prompt + args.new_tokens + 8, max_num_batched_tokens=max(256, args.prompt))
    llms = {mode: LLM(**engine, async_scheduling=mode) for mode in (False, True)}
    prompts = workload(llms[False].model.vocab_size, concurrency, args.prompt)
    for llm in llms.values():       # warm-up: allocator, tables
        llm.generate(prompts[:2], None, use_tqdm=False)
    best = {False: (0.0, 0.0), True: (0.0, 0.0)}   # tokens/s, CPU ms per token
    meter = LoadMeter()
    meter.start()
    for _ in range(args.reps):
        for mode, llm in llms.items():
            wall, cpu, tokens = run_once(llm, prompts, args.new_tokens)
            if tokens / wall > best[mode][0]:
                best[mode] = (tokens / wall, cpu * 1e3 / tokens)
    reading = meter.stop()
    (seq, seq_cpu), (ovl, ovl_cpu) = best[False], best[True]
    name = Path(model).name if os.sep in model else model
    return (f"{name:>12} {concurrency:>4} {k:>2} {seq:>10.1f} {ovl:>10.1f} {ratio_text(ovl / seq, reading):>7} "
            f"{seq_cpu:>9.2f} {ovl_cpu:>9.2f}  {reading.describe()}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["fd-tiny:16:0", "fd-tiny:16:1", "fd-tiny:64:1",
                                                        "ernie-0.3b:16:0"],
                        help="model:concurrency:K (model: fd-tiny, fd-toy or ernie-0.3b)")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="fd-toy, few tokens: check that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.cases, args.prompt, args.new_tokens, args.reps = ["fd-toy:4:1"], 8, 8, 1
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    print(f"async scheduling vs sequential: {args.prompt}-token prompts, {args.new_tokens} new tokens, best of "
          f"{args.reps}, {args.threads} model thread(s)")
    print(f"{'model':>12} {'C':>4} {'K':>2} {'seq tok/s':>10} {'async':>10} {'ratio':>7} {'seq ms/t':>9} "
          f"{'async ms/t':>9}  load", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            model, concurrency, k = case.split(":")
            if model == "ernie-0.3b":
                from benchmarks.real_shapes import COMMON, SHAPES, write_checkpoint
                path = Path(tmp) / model
                if not path.exists():
                    write_checkpoint(path, {**COMMON, **SHAPES[model]}, seed=0)
                model = str(path)
            print(run_case(model, int(concurrency), int(k), args), flush=True)


if __name__ == "__main__":
    main()
