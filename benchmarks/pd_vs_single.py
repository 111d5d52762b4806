"""PD disaggregation vs a single instance on fd-tiny, same workload, no speculation and MTP K = 1, 2. Prints a table.

tokens/s      generated tokens / wall time of the whole workload (all requests submitted at once)
vs single     tokens/s relative to the single instance with the same K
tok/CPU-s     generated tokens / CPU seconds of this process (all threads): the work done, which machine load
              from other processes does not inflate; "vs single CPU" is its ratio to the single instance
MTP speedup   tokens/s relative to the same deployment (single or PD) without speculation
elsewhere     after each load's rows: the most of the machine's CPU other processes took during one of its runs
              (benchmarks/load.py); above 5 % the load's ratios are marked as taken under load, not results
TTFT ms       mean time to first token: from submission to the step whose message carried the request's first
              token (single instance), or to P's token processor recording t0 (PD)
accept        mean tokens emitted per decode round
steps         engine steps of the single instance, or of D under PD (few decoding slots per step shows as more steps)

PD here is LLM(splitwise=True), the in-process pair of fastdeploy/entrypoints/local_router.py: P and D step one after the other
in one thread on the same CPU, so PD cannot be faster than the single instance; its extra costs are the hand-off
(KV gather, encode, integrity tag, decode, scatter) and a separate P forward pass in steps where P has prompts.

Usage: python benchmarks/pd_vs_single.py [--max-tokens 64] [--num-prompts 16 100 300] [--repeats 3]
       [--dtype float32] [--k 0 1 2]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import QUIET_SHARE, LoadMeter  # noqa: E402
from fastdeploy import LLM, SamplingParams  # noqa: E402

PROMPTS = ["The cat sat on the", "Once upon a time, there was", "The weather today is", "My favourite food is",
           "In the morning I like to", "The capital of the country is", "She opened the door and",
           "We walked to the park and", "The number after seven is", "He said that the answer was",
           "A good book should", "The train leaves at", "On the table there is", "The children played with",
           "After dinner we", "The best way to learn is"]
ENGINE = dict(max_num_seqs=16, block_size=16, max_model_len=256, max_num_batched_tokens=512)


class Case:
    """One deployment (single or PD) with one K: its own LLM. Single-instance first-token times come from the trace
    hook (the end of the step that reported them); PD's from RequestOutput.pd_timings (P recording t0)."""

    def __init__(self, splitwise: bool, k: int, args):
        spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
        self.name, self.k = ("PD" if splitwise else "single"), k
        self.first_token_s: dict[str, float] = {}
        self.num_steps = 0          # engine steps of the single instance, or of D under PD
        self.llm = LLM(model="fd-tiny", dtype=args.dtype, speculative_config=spec, splitwise=splitwise,
                       trace_hook=self._on_step, **ENGINE)

    def _on_step(self, step) -> None:
        self.num_steps += 1
        if self.name == "PD":
            return
        now = time.perf_counter()
        for request in [*self.llm.engine.scheduler.running, *step.finished]:
            if request.output_token_ids and request.request_id not in self.first_token_s:
                self.first_token_s[request.request_id] = now

    def run(self, prompts: list[str], params: SamplingParams) -> tuple[int, list[float], list[int]]:
        started = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        ttft = [o.pd_timings.time_to_first_token_s if o.pd_timings else self.first_token_s[o.request_id] - started
                for o in outputs]
        return (sum(len(o.outputs.token_ids) for o in outputs), ttft,
                [n for o in outputs for n in o.metrics.accepted_per_round])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-prompts", "--requests", dest="num_prompts", type=int, nargs="+", default=[16],
                        help="loads to measure: prompts submitted at once (one table row group per load)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--k", type=int, nargs="+", default=[0, 1, 2], help="MTP K values (0 = no speculation)")
    args = parser.parse_args()
    params = SamplingParams(max_tokens=args.max_tokens, min_tokens=args.max_tokens)
    cases = {(case.name, k): case for k in args.k for case in (Case(False, k, args), Case(True, k, args))}
    for case in cases.values():
        case.run(PROMPTS[:2], SamplingParams(max_tokens=8))     # warm-up
    print(f"fd-tiny {args.dtype}, N prompts x {args.max_tokens} tokens (min_tokens = max_tokens), all submitted at "
          f"once, best of {args.repeats} interleaved runs (per column)")
    print(f"{'prompts':>7} {'deploy':>6} {'method':>8} {'tokens/s':>9} {'vs single':>10} {'tok/CPU-s':>10} "
          f"{'vs single CPU':>14} {'MTP speedup':>12} {'TTFT ms':>8} {'accept':>7} {'steps':>6}")
    for num_prompts in args.num_prompts:
        prompts = (PROMPTS * (1 + num_prompts // len(PROMPTS)))[:num_prompts]
        best: dict[tuple[str, int], dict] = {}
        worst_share = 0.0
        for _ in range(args.repeats):       # interleaved, so a burst of machine load hits every case alike
            for key, case in cases.items():
                case.num_steps = 0
                meter = LoadMeter()
                meter.start()
                started, cpu_started = time.perf_counter(), time.process_time()
                tokens, ttft, rounds = case.run(prompts, params)
                worst_share = max(worst_share, meter.stop().elsewhere_share)
                result = dict(tokens_per_s=tokens / (time.perf_counter() - started),
                              tokens_per_cpu_s=tokens / (time.process_time() - cpu_started),
                              ttft_ms=1e3 * sum(ttft) / len(ttft), accept=sum(rounds) / len(rounds),
                              steps=case.num_steps)
                kept = best.setdefault(key, {})
                for name, value in result.items():    # best of the repeats, per column (lowest TTFT)
                    if name not in kept or (value < kept[name] if name == "ttft_ms" else value > kept[name]):
                        kept[name] = value
        for (kind, k), r in best.items():
            vs_single = r["tokens_per_s"] / best["single", k]["tokens_per_s"]
            vs_single_cpu = r["tokens_per_cpu_s"] / best["single", k]["tokens_per_cpu_s"]
            speedup = r["tokens_per_s"] / best[kind, 0]["tokens_per_s"] if (kind, 0) in best else float("nan")
            print(f"{num_prompts:>7} {kind:>6} {('K=%d' % k) if k else 'no-spec':>8} {r['tokens_per_s']:>9.1f} "
                  f"{vs_single:>10.2f} {r['tokens_per_cpu_s']:>10.1f} {vs_single_cpu:>14.2f} {speedup:>12.2f} "
                  f"{r['ttft_ms']:>8.1f} {r['accept']:>7.2f} {r['steps']:>6}")
        loaded = worst_share > QUIET_SHARE
        print(f"{num_prompts:>7} elsewhere: up to {worst_share:.0%} of the machine during a run"
              + (" (loaded: these ratios are not results; re-run on a quiet machine)" if loaded else ""))


if __name__ == "__main__":
    main()
