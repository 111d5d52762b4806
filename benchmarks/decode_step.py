"""fd-tiny step time with the context read head-major (layers/paged_attention.py) against the attention before it
(benchmarks/baseline_attention.py: position-major gather, matmuls over transposed views). Prints three tables.

engine decode steps   The in-process engine (MTP K = 1, float32, block size 16) with `rows` requests whose prompts
                      are 300-360 tokens, stepped by hand once every prompt is prefilled: the wall time of
                      `LLMEngine.step()` (schedule, target pass, verify, MTP pass, token processing) on decode-only
                      steps, old and new attention alternating step by step so that machine load hits both alike.
                      ms/row = step ms / rows.
forward passes        One `FdTiny.forward` (index prep, both target layers, final norm, LM head) on a seeded cache:
                      a 256-token prefill chunk after 74 cached positions, 16 decode rows (2 query tokens each,
                      contexts 300-360), the two in one mixed pass, the MTP pass of the decode rows, and 16 decode
                      rows at contexts 20-400 ("decode-far", where padding to the longest context wastes most); the
                      variants alternating in every repetition. same: old and new logits bit-identical, else the
                      largest difference.
                      by-context ms: the new attention with decode rows also grouped by context (`plan_by_context`
                      below, the alternative to padding every decode row to the longest context: measured, not
                      adopted, docs/benchmarks.md "Decode at memory speed").
group cost            One layer's attention (new) of one decode row at context 16 (a group's fixed work, plus the
                      pass's cache write) and of 16 rows x 2 query tokens at context 330 in one group: their
                      ratio in query x context slots is what GROUP_COST_SLOTS (layers/paged_attention.py) stands for.

All variants run on the same KVCache, the same model and the same steps: only `FdTiny._attend` is swapped (an
instance attribute), so the ratios are the attention's own.

Usage: python benchmarks/decode_step.py [--steps 12] [--reps 20] [--rows 4 8 16 32] [--seed 0]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import paddle

from benchmarks.baseline_attention import baseline_attend
from benchmarks.load import LoadMeter, load_line
from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.model_executor.layers import paged_attention
from fastdeploy.model_executor.layers.paged_attention import PagedAttention
from fastdeploy.model_executor.models import get_model
from fastdeploy.model_executor.models.base import ForwardBatch

BLOCK = 16
WORDS = ("the cat sat on a mat and looked at the quiet garden while rain fell over old stone walls near "
         "the river where children played with bright kites every summer afternoon").split()


def prompt(rng: np.random.Generator, length: int) -> list[int]:
    """Byte tokens of a seeded word sequence, cut to `length` tokens (fd-tiny is byte-level)."""
    text = " ".join(rng.choice(WORDS, length))
    return list(text.encode())[:length]


class EngineCase:
    """One engine with `rows` requests decoding; steps are timed with the old or the new attention."""

    def __init__(self, rows: int, steps: int, rng: np.random.Generator):
        self.rows = rows
        self.llm = LLM(model="fd-tiny", speculative_config={"method": "mtp", "num_speculative_tokens": 1},
                       max_num_seqs=rows, block_size=BLOCK, max_model_len=1024, max_num_batched_tokens=4096)
        engine, tokens = self.llm.engine, 4 * steps + 16     # K = 1 emits at most 2 tokens a step
        for i in range(rows):
            engine.add_request(f"r{i}", prompt(rng, int(rng.integers(300, 361))),
                               SamplingParams(max_tokens=tokens, min_tokens=tokens))
        self.prefilling = True
        execute = engine.runner.execute_model

        def watched(plan):
            self.prefilling = bool(plan.prefill_tasks)
            return execute(plan)

        engine.runner.execute_model = watched
        while self.prefilling or len(engine.scheduler.running) < rows:
            engine.step()
        engine.step()                                          # one decode step of warm-up
        self.times = {"old": [], "new": []}

    def step(self, which: str) -> None:
        set_attention(self.llm.model, which)
        started = time.perf_counter()
        self.llm.engine.step()
        elapsed = time.perf_counter() - started
        if self.prefilling or len(self.llm.engine.scheduler.running) < self.rows:
            raise RuntimeError("decode_step: a request finished or a prefill ran during the timed steps")
        self.times[which].append(elapsed)


def forward_cases(rng: np.random.Generator, model) -> dict[str, tuple]:
    """name -> (batch, kv, mtp): seeded passes over a cache of standard normal K/V on shuffled blocks."""
    contexts = rng.integers(300, 361, 16).tolist()
    chunk = ([330], [256])
    specs = {"prefill": chunk, "decode": (contexts, [2] * 16),
             "mixed": (contexts + chunk[0], [2] * 16 + chunk[1]), "mtp": (contexts, [2] * 16),
             "decode-far": (rng.integers(20, 401, 16).tolist(), [2] * 16)}
    cases = {}
    for name, (ctx, queries) in specs.items():
        per_seq = -(-max(ctx) // BLOCK)
        tables = rng.permutation(per_seq * len(ctx)).reshape(len(ctx), per_seq).astype(np.int32)
        kv = model.new_kv_cache(per_seq * len(ctx), BLOCK)
        kv.layers = [paddle.to_tensor(rng.standard_normal(t.shape).astype(kv.dtype)) for t in kv.layers]
        positions = np.concatenate([np.arange(c - q, c) for c, q in zip(ctx, queries)])
        batch = ForwardBatch(rng.integers(0, 256, sum(queries)), positions,
                             np.concatenate([[0], np.cumsum(queries)]), tables)
        cases[name] = (batch, kv, name == "mtp")
    return cases


def run_forward(model, batch: ForwardBatch, kv, mtp: bool) -> np.ndarray:
    if mtp:
        hidden = paddle.to_tensor(np.ones((batch.num_tokens, model.hidden_size), model.dtype))
        return model.mtp_forward(batch, hidden, kv)[0].numpy()
    return model.forward(batch, kv)[0].numpy()


PLAN_GROUPS = paged_attention.plan_groups


def plan_by_context(q_len: np.ndarray, ctx_len: np.ndarray) -> list[np.ndarray]:
    """plan_groups, but decode rows taken by context length too: each joins the group of the next shorter context
    while that pads the group by fewer slots than GROUP_COST_SLOTS; the chunks' groups as plan_groups makes them."""
    is_decode = q_len <= paged_attention.DECODE_MAX_QUERY
    decode = np.flatnonzero(is_decode)
    chunk_groups = [g for g in PLAN_GROUPS(q_len, ctx_len) if not is_decode[g[0]]]
    groups, current, c_max = [], [], 0
    for i in decode[np.argsort(ctx_len[decode], kind="stable")].tolist():
        c = int(ctx_len[i])
        q_max = int(q_len[current + [i]].max())
        if current and len(current) * q_max * (c - c_max) > paged_attention.GROUP_COST_SLOTS:
            groups.append(np.sort(current))
            current = []
        current.append(i)
        c_max = c
    return groups + ([np.sort(current)] if current else []) + chunk_groups


def by_context_attend(batch: ForwardBatch, kv) -> PagedAttention:
    planner, paged_attention.plan_groups = paged_attention.plan_groups, plan_by_context
    try:
        return PagedAttention(kv, batch.seq_index(), batch.positions, batch.seq_starts, batch.block_tables)
    finally:
        paged_attention.plan_groups = planner


VARIANTS = ("old", "new", "by-context")


def set_attention(model, which: str) -> None:
    model._attend = {"old": baseline_attend, "by-context": by_context_attend}.get(which, type(model)._attend)


def measure_forward(args, rng: np.random.Generator) -> list[str]:
    model = get_model("fd-tiny")
    cases = forward_cases(rng, model)
    times = {(name, w): [] for name in cases for w in VARIANTS}
    for rep in range(args.reps + 1):                 # repetition 0 warms up
        for name, case in cases.items():
            for which in VARIANTS[::1 if rep % 2 else -1]:
                set_attention(model, which)
                started = time.perf_counter()
                run_forward(model, *case)
                if rep:
                    times[name, which].append(time.perf_counter() - started)
    lines = [f"{'pass':<10} {'seqs':>4} {'tokens':>6} {'old ms':>8} {'new ms':>8} {'old/new':>7} "
             f"{'by-context ms':>13}  same"]
    for name, case in cases.items():
        outs = []
        for which in ("old", "new"):
            set_attention(model, which)
            outs.append(run_forward(model, *case))
        same = "yes" if np.array_equal(*outs) else f"no ({float(np.abs(outs[0] - outs[1]).max()):.1e})"
        t_old, t_new, t_one = (1e3 * statistics.median(times[name, w]) for w in VARIANTS)
        lines.append(f"{name:<10} {case[0].num_seqs:>4} {case[0].num_tokens:>6} {t_old:>8.2f} {t_new:>8.2f} "
                     f"{t_old / t_new:>7.2f} {t_one:>13.2f}  {same}")
    return lines


def measure_group_cost(args, rng: np.random.Generator) -> list[str]:
    """Median ms of one layer's attention for (rows, context) in one group, and the slots a fixed cost is worth."""
    nh, hd = 4, 32
    result = {}
    for rows, context in ((1, 16), (16, 330)):
        per_seq = -(-context // BLOCK)
        kv = KVCache(per_seq * rows, BLOCK, [(2, nh, hd)])
        kv.layers[0] = paddle.to_tensor(rng.standard_normal(kv.layers[0].shape).astype("float32"))
        tables = rng.permutation(per_seq * rows).reshape(rows, per_seq).astype(np.int32)
        positions = np.tile(np.arange(context - 2, context), rows)
        attention = PagedAttention(kv, np.repeat(np.arange(rows), 2), positions, np.arange(rows + 1) * 2, tables)
        assert len(attention.groups) == 1
        q, k, v = (paddle.to_tensor(rng.standard_normal((2 * rows, nh, hd)).astype("float32")) for _ in range(3))
        times = []
        for rep in range(args.reps + 1):
            started = time.perf_counter()
            attention(0, q, k, v)
            if rep:
                times.append(time.perf_counter() - started)
        result[rows, context] = (1e3 * statistics.median(times), rows * 2 * context)
    (fixed, _), (full, slots) = result[1, 16], result[16, 330]
    return [f"{'rows':>4} {'context':>7} {'ms':>7} {'slots':>6}",
            *(f"{r:>4} {c:>7} {ms:>7.3f} {n:>6}" for (r, c), (ms, n) in result.items()),
            f"fixed cost = {fixed / ((full - fixed) / slots):.0f} slots"]


def measure_engine(args, rng: np.random.Generator) -> list[str]:
    cases = [EngineCase(rows, args.steps, rng) for rows in args.rows]
    for i in range(2 * args.steps):                  # old, new, new, old, ...: each case alternates
        for case in cases:
            case.step(("old", "new")[(i + i // 2) % 2])
    lines = [f"{'rows':>4} {'old ms':>8} {'new ms':>8} {'old/new':>7} {'old ms/row':>10} {'new ms/row':>10}"]
    for case in cases:
        t_old, t_new = (1e3 * statistics.median(case.times[w]) for w in ("old", "new"))
        lines.append(f"{case.rows:>4} {t_old:>8.2f} {t_new:>8.2f} {t_old / t_new:>7.2f} {t_old / case.rows:>10.2f} "
                     f"{t_new / case.rows:>10.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="timed decode steps per attention and row count")
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions of each forward pass")
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    meter = LoadMeter()
    meter.start()
    engine = measure_engine(args, rng)
    forward = measure_forward(args, rng)
    group = measure_group_cost(args, rng)
    print(f"fd-tiny float32, MTP K = 1, block size {BLOCK}; engine decode-only steps, median of {args.steps} per "
          f"attention, alternating")
    print("\n".join(engine))
    print(f"\none forward pass, median of {args.reps} interleaved repetitions")
    print("\n".join(forward))
    print(f"\none layer's attention (new), median of {args.reps}")
    print("\n".join(group))
    print(load_line(meter.stop()))


if __name__ == "__main__":
    main()
