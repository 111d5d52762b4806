"""Speculative decoding on fd-tiny: no speculation vs MTP K = 1, 2, at batch 1 and batch 16. Prints a table.

tokens/s      generated tokens / wall time of generate()
accept        mean tokens emitted per decode round (1.00 without speculation)
speedup       tokens/s relative to no speculation at the same batch size
speedup/acc   speedup / accept; 1.0 would mean drafting and verifying cost nothing extra
overhead      share of the wall time spent outside the target and MTP forward passes (scheduler, packing,
              verify, the state ops, proposer bookkeeping, token processor)
ms/step       wall time per engine step

Usage: python benchmarks/spec_decode.py [--max-tokens 64] [--repeats 3] [--dtype float32] [--weights W.npz]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadMeter, load_line  # noqa: E402
from fastdeploy import LLM, SamplingParams  # noqa: E402

PROMPTS = ["The cat sat on the", "Once upon a time, there was", "The weather today is", "My favourite food is",
           "In the morning I like to", "The capital of the country is", "She opened the door and",
           "We walked to the park and", "The number after seven is", "He said that the answer was",
           "A good book should", "The train leaves at", "On the table there is", "The children played with",
           "After dinner we", "The best way to learn is"]


class Case:
    """One (K, batch) configuration: its own LLM, timed through the runner's forward seconds."""

    def __init__(self, k: int, batch: int, args):
        spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
        self.k, self.batch = k, batch
        self.llm = LLM(model="fd-tiny", dtype=args.dtype, speculative_config=spec, max_num_seqs=batch,
                       block_size=16, max_model_len=256, max_num_batched_tokens=512,
                       model_options={"weights_path": args.weights} if args.weights else None)
        self.prompts = PROMPTS[:batch] if batch > 1 else PROMPTS[:4]
        self.params = SamplingParams(max_tokens=args.max_tokens, min_tokens=args.max_tokens)
        self.forward_seconds, self.steps, self.best = 0.0, 0, None
        execute = self.llm.engine.runner.execute_model

        def timed_execute(plan):
            output = execute(plan)
            self.steps += 1
            self.forward_seconds += output.forward_seconds
            return output

        self.llm.engine.runner.execute_model = timed_execute
        self.llm.generate(self.prompts[:1], SamplingParams(max_tokens=8))     # warm-up

    def measure(self) -> None:
        """One timed run; keeps the fastest."""
        self.forward_seconds, self.steps = 0.0, 0
        started = time.perf_counter()
        outputs = self.llm.generate(self.prompts, self.params)
        wall = time.perf_counter() - started
        tokens = sum(len(o.outputs.token_ids) for o in outputs)
        rounds = [n for o in outputs for n in o.metrics.accepted_per_round]
        result = dict(tokens_per_s=tokens / wall, accept=sum(rounds) / len(rounds),
                      overhead=1.0 - self.forward_seconds / wall, step_ms=1e3 * wall / self.steps)
        if self.best is None or result["tokens_per_s"] > self.best["tokens_per_s"]:
            self.best = result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--weights", default=None, help="fd-tiny .npz (default: the committed weights)")
    args = parser.parse_args()
    cases = [Case(k, batch, args) for batch in (1, 16) for k in (0, 1, 2)]
    meter = LoadMeter()
    meter.start()
    for _ in range(args.repeats):       # interleaved, so a burst of machine load hits every case alike
        for case in cases:
            case.measure()
    print(f"fd-tiny {args.dtype}, {args.max_tokens} tokens per request (min_tokens = max_tokens), best of "
          f"{args.repeats} interleaved runs")
    print(f"{'batch':>5} {'method':>10} {'tokens/s':>10} {'accept':>7} {'speedup':>8} {'speedup/acc':>12} "
          f"{'overhead':>9} {'ms/step':>8}")
    for case in cases:
        r = case.best
        base = next(c.best["tokens_per_s"] for c in cases if c.batch == case.batch and c.k == 0)
        speedup = r["tokens_per_s"] / base
        print(f"{case.batch:>5} {('MTP K=%d' % case.k) if case.k else 'no-spec':>10} {r['tokens_per_s']:>10.1f} "
              f"{r['accept']:>7.2f} {speedup:>8.2f} {speedup / r['accept']:>12.2f} {r['overhead']:>9.1%} "
              f"{r['step_ms']:>8.2f}")
    print(load_line(meter.stop()))


if __name__ == "__main__":
    main()
