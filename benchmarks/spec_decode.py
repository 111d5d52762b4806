"""Speculative decoding on fd-tiny: no speculation vs MTP K = 1, 2, at batch 1 and batch 16. Prints a table.

tokens/s      generated tokens / wall time of generate()
accept        mean tokens emitted per decode round (1.00 without speculation)
speedup       tokens/s relative to no speculation at the same batch size
speedup/acc   speedup / accept; 1.0 would mean drafting and verifying cost nothing extra
overhead      share of the wall time spent outside the target and MTP forward passes (scheduler, packing,
              verify, the state ops, proposer bookkeeping, token processor)
ms/step       wall time per engine step

Usage: python benchmarks/spec_decode.py [--max-tokens 64] [--repeats 2] [--dtype float32] [--weights W.npz]
"""
from __future__ import annotations

import argparse
import time

from fastdeploy import LLM, SamplingParams

PROMPTS = ["The cat sat on the", "Once upon a time, there was", "The weather today is", "My favourite food is",
           "In the morning I like to", "The capital of the country is", "She opened the door and",
           "We walked to the park and", "The number after seven is", "He said that the answer was",
           "A good book should", "The train leaves at", "On the table there is", "The children played with",
           "After dinner we", "The best way to learn is"]


def measure(k: int, batch: int, args) -> dict:
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    llm = LLM(model="fd-tiny", dtype=args.dtype, speculative_config=spec, max_num_seqs=batch, block_size=16,
              max_model_len=256, max_num_batched_tokens=512,
              model_options={"weights_path": args.weights} if args.weights else None)
    runner = llm.engine.runner
    forward = {"seconds": 0.0, "count": 0}
    execute = runner.execute_model

    def timed_execute(plan):
        output = execute(plan)
        forward["count"] += 1
        forward["seconds"] += output.forward_seconds
        return output

    runner.execute_model = timed_execute
    prompts = PROMPTS[:batch] if batch > 1 else PROMPTS[:4]
    params = SamplingParams(max_tokens=args.max_tokens, min_tokens=args.max_tokens)
    llm.generate(prompts[:1], SamplingParams(max_tokens=8))     # warm-up
    best = None
    for _ in range(args.repeats):
        forward.update(seconds=0.0, count=0)
        started = time.perf_counter()
        outputs = llm.generate(prompts, params)
        wall = time.perf_counter() - started
        tokens = sum(len(o.outputs.token_ids) for o in outputs)
        rounds = [n for o in outputs for n in o.metrics.accepted_per_round]
        result = dict(tokens_per_s=tokens / wall, accept=sum(rounds) / len(rounds),
                      overhead=1.0 - forward["seconds"] / wall, step_ms=1e3 * wall / forward["count"])
        if best is None or result["tokens_per_s"] > best["tokens_per_s"]:
            best = result
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--weights", default=None, help="fd-tiny .npz (default: the committed weights)")
    args = parser.parse_args()
    print(f"fd-tiny {args.dtype}, {args.max_tokens} tokens per request (min_tokens = max_tokens), best of "
          f"{args.repeats}")
    print(f"{'batch':>5} {'method':>10} {'tokens/s':>10} {'accept':>7} {'speedup':>8} {'speedup/acc':>12} "
          f"{'overhead':>9} {'ms/step':>8}")
    for batch in (1, 16):
        base = None
        for k in (0, 1, 2):
            r = measure(k, batch, args)
            base = base or r["tokens_per_s"]
            speedup = r["tokens_per_s"] / base
            print(f"{batch:>5} {('MTP K=%d' % k) if k else 'no-spec':>10} {r['tokens_per_s']:>10.1f} "
                  f"{r['accept']:>7.2f} {speedup:>8.2f} {speedup / r['accept']:>12.2f} {r['overhead']:>9.1%} "
                  f"{r['step_ms']:>8.2f}")


if __name__ == "__main__":
    main()
