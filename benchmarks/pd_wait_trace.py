"""Where a PD request waits when D is saturated: a step trace of the in-process pair (`LLM(splitwise=True)`).

D takes a request's slot when it reserves (docs/design.md §6), so with more requests than D's slots the extra ones
wait before P even starts them; once a request has its first token it decodes in every D step. For each load
(requests submitted at once, D with --slots slots) the table gives, per request, medians and maxima of:

wait for D        arrival to P's start (P starts a request only once D reserved its blocks and slot)
prefill on P      P's start to t0
hand-off          t0 to D's first round (the hand-off's trip and D's receipt)
gap p50 / max     time between consecutive D steps that emitted tokens for the request (the stalls a client sees
                  between tokens; a request that waited for a slot after its first token would show it here)
idle D steps      D steps in which a received request was not decoded (received but slot-less: always 0 here)

Usage: python benchmarks/pd_wait_trace.py [--slots 8] [--loads 8 16 32] [--max-tokens 48] [--mtp 1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastdeploy import LLM, SamplingParams  # noqa: E402
from fastdeploy.model_executor.ops.step_message import decode_step_message  # noqa: E402

PROMPT_WORDS = ["the", "cat", "sat", "on", "a", "warm", "stone", "near", "river", "while", "children", "played"]


class DecodeSteps:
    """D's trace hook: when each D step emitted tokens for each request, and received requests left waiting."""

    def __init__(self):
        self.emitted: dict[str, list[float]] = {}
        self.idle_received = 0
        self.llm: LLM | None = None

    def __call__(self, step) -> None:
        now = time.perf_counter()
        decoded = decode_step_message(step.output.message)
        for slot, entry in enumerate(decoded[1] if decoded else []):
            request = step.slot_owners.get(slot)
            if request is not None and entry and entry[0] >= 0:
                self.emitted.setdefault(request.request_id, []).append(now)
        self.idle_received += len(self.llm.engine.decode.scheduler.prefilled)


def run(load: int, args) -> dict[str, list[float]]:
    steps = DecodeSteps()
    spec = {"method": "mtp", "num_speculative_tokens": args.mtp} if args.mtp else None
    llm = LLM(model="fd-tiny", speculative_config=spec, max_num_seqs=args.slots, splitwise=True, trace_hook=steps)
    steps.llm = llm
    prompts = [" ".join(PROMPT_WORDS[(i + j) % len(PROMPT_WORDS)] for j in range(40)) for i in range(load)]
    params = SamplingParams(max_tokens=args.max_tokens, min_tokens=args.max_tokens)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    rows: dict[str, list[float]] = {"wait": [], "prefill": [], "handoff": [], "gap": [], "max_gap": []}
    for out in outputs:
        t = out.pd_timings
        rows["wait"].append(t.prefill_start_s - t.arrival_s)
        rows["prefill"].append(t.first_token_s - t.prefill_start_s)
        rows["handoff"].append(t.decode_start_s - t.first_token_s)
        times = steps.emitted[out.request_id]
        gaps = [b - a for a, b in zip(times, times[1:])]
        rows["gap"] += gaps
        rows["max_gap"].append(max(gaps) if gaps else 0.0)
    rows["idle"] = [float(steps.idle_received)]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slots", type=int, default=8, help="slots of P and of D")
    parser.add_argument("--loads", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--mtp", type=int, default=1)
    args = parser.parse_args()
    ms = lambda values, f: 1e3 * f(values) if values else float("nan")   # noqa: E731
    print(f"fd-tiny, MTP K = {args.mtp}, {args.slots} slots on P and D, {args.max_tokens} tokens per request, "
          "times in ms")
    print("| load | wait for D p50 | wait for D max | prefill on P p50 | hand-off p50 | gap p50 | gap max | "
          "idle D steps |\n|---:|---:|---:|---:|---:|---:|---:|---:|")
    for load in args.loads:
        r = run(load, args)
        print(f"| {load} | {ms(r['wait'], statistics.median):.1f} | {ms(r['wait'], max):.1f} | "
              f"{ms(r['prefill'], statistics.median):.1f} | {ms(r['handoff'], statistics.median):.1f} | "
              f"{ms(r['gap'], statistics.median):.1f} | {ms(r['max_gap'], max):.1f} | {int(r['idle'][0])} |",
              flush=True)


if __name__ == "__main__":
    main()
