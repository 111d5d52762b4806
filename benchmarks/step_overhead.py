"""The host's work per engine step, outside the model's passes (docs/benchmarks.md "Host work per step").

On an accelerator the passes are short and what the host does between them decides throughput. The model is the
null model by default (benchmarks/null_model.py: its passes return pre-made logits in ~0 time, so a step's time is
all host work), or fd-toy (`--model fd-toy`, whose passes are NumPy hashes over the cache; their time is
subtracted). For each number of running requests and each K the engine decodes until every request runs, and the
table prints, over the decode-only steps with every request running, the median host time per step (step wall time
less the passes' own time) and that per row. The step's parts come from the step trace (`StepTrace.times`,
schema/step_io.py StepTimes): schedule, prepare (inputs), state ops, sample+verify, draft (the MTP proposer's own
work), outputs (the runner's report), tokens (token processing); `front` is what `LLM.generate` does between two
engine steps (and, for the D role, P's idle step beside it; none for P, whose measured step is the first of a
batch). P's `tokens` part includes sending the hand-offs (the connector reads and tags each prompt's KV).

Roles: mixed (one instance), decode (D of an in-process PD pair: the prompts are prefilled on P), prefill (P: the
step that prefills every prompt, one per batch, repeated `--batches` times). `--profile ROWS K` prints where the
time goes (cProfile, the functions with the most time of their own).
Usage: python benchmarks/step_overhead.py [--rows 1 16 64 256] [--k 0 1 2] [--roles mixed decode] [--steps 40]
[--model null] [--profile 64 1]
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import logging
import pstats
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadMeter, load_line  # noqa: E402

PROMPT_LEN = 8
PARTS = ("schedule", "prepare", "sample_verify", "state_ops", "draft", "outputs", "tokens")
SHORT = {"schedule": "sched", "prepare": "prep", "sample_verify": "verify", "state_ops": "state",
         "draft": "draft", "outputs": "out", "tokens": "tokens", "front": "front"}


@dataclass(slots=True)
class StepSample:
    """One measured step, in milliseconds: the engine's parts, the front end's share, and their sum."""

    parts: dict[str, float]
    front: float

    @property
    def host(self) -> float:
        return sum(self.parts.values()) + self.front


@contextlib.contextmanager
def _model(name: str):
    """LLM builds its model with get_model; the null model is not registered, so it is handed in here."""
    if name == "fd-toy":
        yield
        return
    from benchmarks.null_model import NullModel
    with mock.patch("fastdeploy.entrypoints.llm.get_model", lambda *args, **kwargs: NullModel()):
        yield


def measure(rows: int, k: int, steps: int, role: str = "mixed", model: str = "null", batches: int = 8,
            profile: cProfile.Profile | None = None) -> list[StepSample]:
    """The host work of each measured step: decode steps with all `rows` requests running (mixed, decode), or the
    steps that prefill all `rows` prompts (prefill). `profile` is enabled from the first measured step on."""
    from fastdeploy import LLM, SamplingParams

    samples: list[StepSample] = []
    last = [time.perf_counter()]

    def hook(trace) -> None:
        now = time.perf_counter()
        times = trace.times
        if role == "prefill":
            measured = len(trace.plan.prefill_tasks) == rows
        else:
            measured = not trace.plan.prefill_tasks and not trace.plan.decode_tasks and len(trace.slot_owners) == rows
        if measured and profile is not None and not samples:
            profile.enable()
        if measured:
            parts = {part: getattr(times, part) * 1e3 for part in PARTS}
            # P's measured step is the first of its batch: the time before it is the batch's admission, not a
            # front end's per-step share
            front = 0.0 if role == "prefill" else (now - last[0] - times.passes - times.host) * 1e3
            samples.append(StepSample(parts, max(front, 0.0)))
        last[0] = now

    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    new_tokens = 2 if role == "prefill" else steps * (k + 1)
    with _model(model):
        llm = LLM(model="fd-toy", speculative_config=spec, max_num_seqs=rows,
                  max_num_batched_tokens=max(256, rows * PROMPT_LEN), max_model_len=PROMPT_LEN + new_tokens + 32,
                  enable_prefix_caching=False, splitwise=role != "mixed",
                  trace_hook=None if role == "prefill" else hook,
                  model_options={"mtp_agreement": 0.7} if model == "fd-toy" else None)
    if role == "prefill":
        llm.engine.prefill.trace_hook = hook   # LLM(splitwise=True) hands its hook to D
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    for batch in range(batches if role == "prefill" else 1):
        prompts = [[3 + (batch + i * 7 + j) % 200 for j in range(PROMPT_LEN)] for i in range(rows)]
        last[0] = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
    return samples


def host_ms(rows: int, k: int, steps: int, role: str = "mixed", model: str = "null") -> list[float]:
    """Host milliseconds of each measured step (see `measure`)."""
    return [s.host for s in measure(rows, k, steps, role, model)]


def _median_parts(samples: list[StepSample]) -> dict[str, float]:
    names = (*PARTS, "front")
    return {name: statistics.median(s.parts[name] if name in s.parts else s.front for s in samples)
            for name in names}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--k", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--roles", nargs="+", choices=("mixed", "decode", "prefill"), default=["mixed", "decode"])
    parser.add_argument("--steps", type=int, default=40, help="decode steps per request (at least)")
    parser.add_argument("--model", choices=("null", "fd-toy"), default="null")
    parser.add_argument("--parts", action="store_true", help="also print the median of each part")
    parser.add_argument("--profile", type=int, nargs=2, metavar=("ROWS", "K"), default=None)
    args = parser.parse_args(argv)
    logging.getLogger("fastdeploy").setLevel(logging.WARNING)   # the per-instance start lines
    if args.profile:
        profile = cProfile.Profile()
        measure(args.profile[0], args.profile[1], args.steps, args.roles[0], args.model, profile=profile)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    meter = LoadMeter()
    meter.start()
    print(f"{args.model} model: host ms per step outside the passes (median over the measured steps)")
    for role in args.roles:
        print(f"role {role}")
        print(f"{'rows':>6}" + "".join(f"{f'K={k} ms':>12}{f'K={k} us/row':>14}" for k in args.k))
        details = []
        for rows in args.rows:
            cells = []
            for k in args.k:
                samples = measure(rows, k, args.steps, role, args.model)
                median = statistics.median(s.host for s in samples) if samples else float("nan")
                cells.append(f"{median:>12.3f}{median * 1e3 / rows:>14.1f}")
                if args.parts and samples:
                    details.append((rows, k, _median_parts(samples)))
            print(f"{rows:>6}" + "".join(cells))
        if details:
            names = (*PARTS, "front")
            print(f"{'rows':>6}{'K':>3}" + "".join(f"{SHORT[n]:>9}" for n in names) + "   (median ms per part)")
            for rows, k, parts in details:
                print(f"{rows:>6}{k:>3}" + "".join(f"{parts[n]:>9.3f}" for n in names))
    print(load_line(meter.stop()))


if __name__ == "__main__":
    main()
