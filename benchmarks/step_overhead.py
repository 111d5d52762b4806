"""The host's work per engine step, outside the model's passes (docs/benchmarks.md "Step overhead").

On an accelerator the passes are short and what the host does between them (schedule, inputs, state ops,
sampling and verification, token processing, outputs) decides throughput. Here the model is fd-toy, whose passes
are a few NumPy lookups (their time is subtracted anyway): for each number of running requests and each K the
engine decodes until every request runs, and the table prints, over the decode-only steps with every request
running, the median of (step wall time - the passes' own time, RunnerOutput.forward_seconds) and that per row.
`--profile ROWS K` prints where that time goes (cProfile, the functions with the most time of their own).

The mixed role only: P's steps are prefill passes and D's decode steps are a mixed instance's plus polling the
connector. Usage: python benchmarks/step_overhead.py [--rows 1 16 64 256] [--k 0 1 2] [--steps 40]
[--profile 64 1]
"""
from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadMeter, load_line  # noqa: E402

PROMPT_LEN = 8


def host_ms(rows: int, k: int, steps: int) -> list[float]:
    """Host milliseconds of each decode-only step with all `rows` requests running."""
    from fastdeploy import LLM, SamplingParams

    times: list[float] = []
    last = [time.perf_counter()]

    def hook(trace) -> None:
        now = time.perf_counter()
        if not trace.plan.prefill_tasks and len(trace.slot_owners) == rows:
            times.append((now - last[0] - trace.output.forward_seconds) * 1e3)
        last[0] = now

    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    llm = LLM(model="fd-toy", speculative_config=spec, max_num_seqs=rows, max_num_batched_tokens=max(256, rows * 8),
              max_model_len=PROMPT_LEN + steps * (k + 1) + 32, trace_hook=hook, enable_prefix_caching=False,
              model_options={"mtp_agreement": 0.7})
    prompts = [[3 + (i * 7 + j) % 200 for j in range(PROMPT_LEN)] for i in range(rows)]
    llm.generate(prompts, SamplingParams(max_tokens=steps * (k + 1), ignore_eos=True), use_tqdm=False)
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--k", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40, help="decode steps per request (at least)")
    parser.add_argument("--profile", type=int, nargs=2, metavar=("ROWS", "K"), default=None)
    args = parser.parse_args(argv)
    logging.getLogger("fastdeploy").setLevel(logging.WARNING)   # the per-instance start lines
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        host_ms(args.profile[0], args.profile[1], args.steps)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    meter = LoadMeter()
    meter.start()
    print("fd-toy, mixed role: host ms per decode step outside the passes (median over the steps with every "
          "request running)")
    print(f"{'rows':>6}" + "".join(f"{f'K={k} ms':>12}{f'K={k} us/row':>14}" for k in args.k))
    for rows in args.rows:
        cells = []
        for k in args.k:
            times = host_ms(rows, k, args.steps)
            median = statistics.median(times) if times else float("nan")
            cells.append(f"{median:>12.2f}{median * 1e3 / rows:>14.1f}")
        print(f"{rows:>6}" + "".join(cells))
    print(load_line(meter.stop()))


if __name__ == "__main__":
    main()
