"""Serving deployments side by side on the same workload, counted as vLLM's `benchmark_serving` counts: the
in-process engine, one mixed service (alone and behind the router), two mixed services behind the router, and PD
services (router + P + D). Prints one table per workload with ratios, the CPU each process spent per output token,
and the targets of docs/benchmarks.md ("Serving") met or not.

Workloads (greedy, fixed seed, outputs forced with min_tokens = max_tokens so every side emits the same tokens):

random   each client sends its next request when the previous one finished (closed loop); output lengths drawn
         from --min-output..--max-output
bursty   C requests arrive at once, every one --burst-output tokens long; the next burst arrives when the previous
         one has finished, so prefills come in bursts and decoding runs in lockstep
shared   closed loop; every prompt is one ~--system-prompt-chars-token system prompt plus a short user part (the
         prefix cache's case; --prompts does not apply), outputs as in random
multiturn  closed loop over C-sized rounds of conversations: turn t's prompt is turn t - 1's prompt, a fixed
         assistant reply and a new user part (each turn's prompt extends the last); outputs as in random

--compare-prefix-caching runs every deployment twice, with the prefix cache (the default) and with
--no-enable-prefix-caching ("<name> no-cache", its ratio against the cached one). Every level starts from an empty
prefix cache (POST /reset_prefix_cache), so a repeated run does not hit what the previous one cached.

Prompts are short (4..--max-prompt-words words) or long (~--long-prompt-words words: the case PD exists for).

in-process   the same LLMEngine driven in this process, C requests in flight; token times are the end of the step
             that produced them (a step's tokens of one request are one chunk)
service      `python -m fastdeploy.entrypoints.openai.api_server` on 127.0.0.1, C asyncio clients streaming
             /v1/completions over HTTP; token times are SSE chunk arrivals at the client
routed       that service behind `python -m fastdeploy.router.launch` (the router's hop)
2 mixed      the router with two mixed services
PD           the router with --splitwise, one prefill and one decode service; D has --decode-slots slots (default:
             the two mixed services' total), P --max-num-seqs
PD same      the same with D at --max-num-seqs slots, like every other instance
PD mooncake  PD with --cache-transfer-protocol mooncake-tcp: the KV written one-sided into D's blocks
1P2D         the router with one P and two D, every instance at --max-num-seqs slots (the P:D ratio for decode-
             heavy load: two D cores decode)
2P1D         two P at --max-num-seqs slots and one D at --decode-slots (the ratio for prefill-heavy load)

out tok/s        output tokens per second of wall time over the whole level
TTFT p50/p99     request sent to its first token
ITL p50/p99      vLLM's inter-token latency: the gap before each streamed chunk after the first (a chunk may carry
                 several tokens: MTP emits several per round)
TPOT p50         vLLM's time per output token: (latency - TTFT) / (output tokens - 1), per request
tok-ITL p99      the per-token view: a chunk of n tokens counts as one gap and n - 1 zero gaps
CPU ms/tok       CPU seconds (user + system) per output token of every process of the deployment (engine cores,
                 API servers, router; not the benchmark's clients), from /proc; in-process: this process's own;
                 split by group, P's and D's engine cores apart; "busy" is each core group's CPU over wall time
elsewhere        the share of the machine's CPU (wall time x cores) that processes other than the benchmark and
                 the deployment took during the run (benchmarks/load.py); above 5 % the run is "loaded"
ratio, vs        out tok/s over that of the deployment named in "vs" at the same concurrency; "(r) loaded" when
                 either run was loaded: not a result, and no target is judged on it

Usage: python benchmarks/serving.py [--model fd-tiny] [--mtp 1] [--concurrency 8 16 32] [--requests 64]
       [--repeats 2] [--deployments in-process service routed mixed2 pd pd-same pd-mooncake pd-1p2d pd-2p1d]
       [--workloads random bursty]
       [--prompts short long]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.load import QUIET_SHARE, LoadMeter, LoadReading, process_cpu_s, quiet, ratio_text  # noqa: E402
from tests.services import deployment as deploy  # noqa: E402  (router deployments of the services tests)
from tests.services import launcher  # noqa: E402  (the services tests' process helpers)

WORDS = ["the", "cat", "sat", "on", "a", "warm", "stone", "near", "river", "while", "children", "played", "and",
         "sang", "about", "seven", "quiet", "clouds", "over", "hills"]


@dataclass(slots=True)
class Job:
    prompt: str
    output_len: int


@dataclass
class Level:
    """What one concurrency level measured."""

    wall_s: float = 0.0
    requests: int = 0
    tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)          # one gap per chunk after the first (vLLM)
    token_itl_s: list[float] = field(default_factory=list)    # one gap per token (n - 1 zero gaps per chunk)
    tpot_s: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)     # process group -> CPU seconds over the level
    load: LoadReading | None = None                            # what other processes took meanwhile

    def record(self, sent: float, arrivals: list[tuple[float, int]]) -> None:
        """`arrivals`: (time, tokens in that chunk) of one request."""
        tokens = sum(n for _, n in arrivals)
        self.requests += 1
        self.tokens += tokens
        first = arrivals[0][0]
        self.ttft_s.append(first - sent)
        previous = first
        self.token_itl_s += [0.0] * (arrivals[0][1] - 1)
        for t, n in arrivals[1:]:
            self.itl_s.append(t - previous)
            self.token_itl_s += [t - previous] + [0.0] * (n - 1)
            previous = t
        if tokens > 1:
            self.tpot_s.append((arrivals[-1][0] - first) / (tokens - 1))

    def cpu_ms_per_token(self) -> float:
        return 1e3 * sum(self.cpu_s.values()) / self.tokens if self.tokens else float("nan")

    def cpu_split(self) -> str:
        """ms per output token of each process group, when there are several, and how busy the engine cores were."""
        if len(self.cpu_s) < 2 or not self.tokens:
            return ""
        split = ", ".join(f"{name} {1e3 * s / self.tokens:.2f}" for name, s in self.cpu_s.items())
        busy = ", ".join(f"{name.removeprefix('core ')} {s / self.wall_s:.0%}" for name, s in self.cpu_s.items()
                         if name.startswith("core ") and self.wall_s)
        return f" ({split}{'; busy ' + busy if busy else ''})"


def make_jobs(args, workload: str, prompts: str) -> list[Job]:
    if workload in ("shared", "multiturn"):
        return prefix_sharing_jobs(args, workload)
    rng = random.Random(args.seed)
    low, high = (4, args.max_prompt_words) if prompts == "short" else \
        (int(args.long_prompt_words * 0.9), int(args.long_prompt_words * 1.1))
    jobs = []
    for _ in range(args.requests):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))
        length = args.burst_output if workload == "bursty" else rng.randint(args.min_output, args.max_output)
        jobs.append(Job(prompt, length))
    return jobs


def prefix_sharing_jobs(args, workload: str) -> list[Job]:
    """shared: one system prompt of ~--system-prompt-chars byte tokens + 4..12 user words per request. multiturn:
    conversations of --turns turns (job i is turn i // conversations of conversation i % conversations), each
    turn's prompt the previous turn's plus a fixed reply and a new user part."""
    rng = random.Random(args.seed)
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))   # noqa: E731
    output = lambda: rng.randint(args.min_output, args.max_output)    # noqa: E731
    if workload == "shared":
        system = ("System: " + words(args.system_prompt_chars))[:args.system_prompt_chars]
        return [Job(f"{system}\nUser: {words(rng.randint(4, 12))}\nAssistant:", output())
                for _ in range(args.requests)]
    conversations = max(1, args.requests // args.turns)
    history = [f"System: {words(16)}" for _ in range(conversations)]
    jobs = []
    for _ in range(args.turns):
        for i in range(conversations):
            history[i] += f"\nUser: {words(rng.randint(3, 8))}\nAssistant:"
            jobs.append(Job(history[i], output()))
            history[i] += f" {words(10)}"
    return jobs


def batches(jobs: list[Job], c: int, workload: str) -> list[list[Job]]:
    """Closed loop: one batch of every job (C in flight). Bursty: bursts of C, each after the previous ended."""
    return [jobs[i:i + c] for i in range(0, len(jobs), c)] if workload == "bursty" else [jobs]


# ---- process CPU ----

def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def process_groups(target) -> dict[str, list[int]]:
    """The pids of a deployment by job: API servers, engine cores (each API server's child), router."""
    servers = {"": target} if isinstance(target, launcher.Server) else target.instances
    groups = {"api": [s.process.pid for s in servers.values()]}
    # one group per engine core, named for its instance under PD: P's and D's loads differ
    pd = any(name.startswith("prefill") for name in servers)
    for name, server in servers.items():
        groups.setdefault(f"core {name}" if pd else "core", []).extend(_children(server.process.pid))
    if not isinstance(target, launcher.Server):
        groups["router"] = [target.router.process.pid]
    return groups


def cpu_snapshot(groups: dict[str, list[int]]) -> dict[str, float]:
    return {name: sum(process_cpu_s(pid) for pid in pids) for name, pids in groups.items()}


# ---- one level ----

def run_in_process(llm, jobs: list[Job], c: int, workload: str) -> Level:
    from fastdeploy import SamplingParams
    engine, level, ids = llm.engine, Level(), iter(range(len(jobs)))
    meter = LoadMeter()
    meter.start()
    cpu, started = time.process_time(), time.perf_counter()
    for batch in batches(jobs, c, workload):
        pending, live = list(reversed(batch)), {}
        while pending or live:
            while pending and len(live) < c:
                job = pending.pop()
                request = engine.add_request(f"bench-{next(ids)}", llm.tokenizer.encode(job.prompt),
                                             SamplingParams(max_tokens=job.output_len, min_tokens=job.output_len))
                live[request.request_id] = (request, time.perf_counter(), [])
            engine.step()
            now = time.perf_counter()
            for rid, (request, sent, arrivals) in list(live.items()):
                new = len(request.output_token_ids) - sum(n for _, n in arrivals)
                if new:
                    arrivals.append((now, new))
                if request.finish_reason is not None:
                    level.record(sent, arrivals)
                    del live[rid]
    level.wall_s = time.perf_counter() - started
    level.cpu_s = {"in-process": time.process_time() - cpu}
    level.load = meter.stop()
    return level


async def _stream_one(client: httpx.AsyncClient, model: str, job: Job, level: Level) -> None:
    body = {"model": model, "prompt": job.prompt, "max_tokens": job.output_len, "min_tokens": job.output_len,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    sent, arrivals, total = time.perf_counter(), [], 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("usage"):
                total = chunk["usage"]["completion_tokens"]
            elif chunk["choices"][0]["text"]:
                # byte tokenizer: a chunk's UTF-8 bytes are its tokens (up to text held back across chunks)
                arrivals.append([time.perf_counter(), len(chunk["choices"][0]["text"].encode())])
    arrivals[-1][1] += total - sum(n for _, n in arrivals)   # the usage count is exact
    level.record(sent, [(t, n) for t, n in arrivals])


async def stream_batches(client: httpx.AsyncClient, model: str, job_batches: list[list[Job]], c: int,
                         level: Level) -> None:
    """Each batch with `c` clients streaming its jobs (closed loop), the next batch once it is done."""
    for batch in job_batches:
        queue = list(reversed(batch))

        async def worker():
            while queue:
                await _stream_one(client, model, queue.pop(), level)

        await asyncio.gather(*(worker() for _ in range(min(c, len(batch)))))


def run_service(target, jobs: list[Job], c: int, workload: str, args) -> Level:
    server = target if isinstance(target, launcher.Server) else target.router
    groups = process_groups(target)
    meter = LoadMeter([pid for pids in groups.values() for pid in pids])

    async def main() -> Level:
        level = Level()
        limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
        async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as client:
            meter.start()
            before, started = cpu_snapshot(groups), time.perf_counter()
            await stream_batches(client, args.model, batches(jobs, c, workload), c, level)
            level.wall_s = time.perf_counter() - started
            after = cpu_snapshot(groups)
            level.load = meter.stop()
        level.cpu_s = {name: after[name] - before[name] for name in groups}
        return level

    return asyncio.run(main())


# ---- deployments ----

# name -> (label, the deployment its ratio is against)
DEPLOYMENTS = {"in-process": ("in-process", "in-process"), "service": ("service", "in-process"),
               "routed": ("routed", "service"), "mixed2": ("2 mixed", "in-process"), "pd": ("PD", "mixed2"),
               "pd-same": ("PD same", "mixed2"), "pd-mooncake": ("PD mooncake", "mixed2"),
               "pd-1p2d": ("1P2D", "mixed2"), "pd-2p1d": ("2P1D", "mixed2")}
# PD deployments with several P or D: (number of P, number of D, D slots: each instance's or --decode-slots)
FLEETS = {"pd-1p2d": (1, 2, "instance"), "pd-2p1d": (2, 1, "decode")}


def start_deployments(args, flags: list[str]) -> dict[str, object]:
    """Every requested deployment but the in-process one, started at once and waited for together."""
    slots = ["--max-num-seqs", str(args.max_num_seqs)]
    decode_slots = ["--max-num-seqs", str(args.decode_slots or 2 * args.max_num_seqs)]
    started: dict[str, object] = {}
    try:
        for name in args.deployments:
            if name == "service":
                started[name] = launcher.start(*flags, *slots, model=args.model, wait_ready=False)
            elif name == "routed":
                started[name] = deploy.mixed_deployment(model=args.model, count=1, flags=(*flags, *slots),
                                                        wait=False)
            elif name == "mixed2":
                started[name] = deploy.mixed_deployment(model=args.model, flags=(*flags, *slots), wait=False)
            elif name in FLEETS:
                num_prefill, num_decode, d_slots = FLEETS[name]
                started[name] = deploy.fleet_deployment(
                    args.model, 0, num_prefill, num_decode, flags=(*flags, *slots),   # flags hold the MTP config
                    decode_flags=tuple(decode_slots if d_slots == "decode" else slots), wait=False)
            elif name.startswith("pd"):
                d_slots = slots if name == "pd-same" else decode_slots
                transfer = ("--cache-transfer-protocol", "mooncake-tcp") if name == "pd-mooncake" else ()
                started[name] = deploy.pd_deployment(model=args.model, prefill_flags=(*flags, *slots, *transfer),
                                                     decode_flags=(*flags, *d_slots, *transfer), wait=False)
        for name, target in started.items():
            launcher.await_ready(target) if name == "service" else target.await_ready()
    except BaseException:
        stop_deployments(started)
        raise
    return started


def stop_deployments(started: dict[str, object]) -> None:
    for name, target in started.items():
        launcher.stop(target) if name.removesuffix(NO_CACHE) == "service" else target.stop()


def run_level(name: str, target, llm, jobs: list[Job], c: int, workload: str, args) -> Level:
    """One level from a cold prefix cache: the same jobs run again (repeats, other levels) must not hit what an
    earlier run left cached."""
    if name == "in-process":
        llm.reset_prefix_cache()
        return run_in_process(llm, jobs, c, workload)
    servers = [target] if isinstance(target, launcher.Server) else target.instances.values()
    for server in servers:
        httpx.post(server.url + "/reset_prefix_cache", timeout=30).raise_for_status()
    return run_service(target, jobs, c, workload, args)


# ---- report ----

def _pct(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    return 1e3 * (statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0])


def _rate(level: Level) -> float:
    return level.tokens / level.wall_s


HEADER = ("| deployment | C   | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | TPOT p50 | tok-ITL p99 | "
          "CPU ms/tok | elsewhere | ratio | vs |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")


NO_CACHE = " no-cache"   # --compare-prefix-caching: the deployment started with --no-enable-prefix-caching


def _label(name: str) -> tuple[str, str]:
    """(label, the deployment its ratio is against); a no-cache run is against the same deployment cached."""
    if name.endswith(NO_CACHE):
        return DEPLOYMENTS[name.removesuffix(NO_CACHE)][0] + NO_CACHE, name.removesuffix(NO_CACHE)
    return DEPLOYMENTS[name]


def print_level(c: int, best: dict[str, Level]) -> None:
    for name, level in best.items():
        label, versus = _label(name)
        reference = best.get(versus)
        ratio = ratio_text(_rate(level) / _rate(reference), level.load, reference.load) \
            if reference is not None else "-"
        print(f"| {label} | {c} | {_rate(level):.1f} | {_pct(level.ttft_s, 50):.1f} | {_pct(level.ttft_s, 99):.1f} "
              f"| {_pct(level.itl_s, 50):.1f} | {_pct(level.itl_s, 99):.1f} | {_pct(level.tpot_s, 50):.2f} | "
              f"{_pct(level.token_itl_s, 99):.1f} | {level.cpu_ms_per_token():.2f}{level.cpu_split()} | "
              f"{_elsewhere(level)} | {ratio} | {_label(versus)[0] if reference is not None else '-'} |", flush=True)
    loaded = [_label(name)[0] for name, level in best.items() if not quiet(level.load)]
    if loaded:
        print(f"under load at C = {c} (more than {QUIET_SHARE:.0%} of the machine elsewhere): {', '.join(loaded)}; "
              "their ratios are not results: re-run on a quiet machine", flush=True)


def _elsewhere(level: Level) -> str:
    return "-" if level.load is None else f"{level.load.elsewhere_share:.0%}{'!' if level.load.loaded else ''}"


def _judged(value: float, op: str, bound: float, *levels: Level) -> str:
    """A target's verdict, or why there is none: a ratio taken under load is not a result."""
    if not quiet(*(level.load for level in levels)):
        return f"({op} {bound}: not judged, taken under load)"
    met = value >= bound if op == ">=" else value <= bound
    return f"({op} {bound}: {'met' if met else 'NOT met'})"


def best_run(levels: list[Level]) -> Level:
    """The fastest of a deployment's repeats among those taken on a quiet machine (the fastest of all, marked
    loaded, when none was)."""
    quiet_runs = [level for level in levels if quiet(level.load)]
    return max(quiet_runs or levels, key=_rate)


def print_targets(c: int, best: dict[str, Level], prompts: str) -> None:
    """docs/benchmarks.md "Serving" targets at this level, each with its measured value."""
    def ratio(a: str, b: str, of=_rate) -> tuple[float, Level, Level] | None:
        return (of(best[a]) / of(best[b]), best[a], best[b]) if a in best and b in best else None

    itl99 = lambda level: _pct(level.itl_s, 99)   # noqa: E731
    cpu = Level.cpu_ms_per_token
    checks = []
    if c in (16, 32):
        checks += [("service / in-process throughput", ratio("service", "in-process"), ">=", 0.95),
                   ("service / in-process CPU per token", ratio("service", "in-process", cpu), "<=", 1.2)]
    if c == 16:
        checks.append(("routed / service throughput (router hop)", ratio("routed", "service"), ">=", 0.97))
    if prompts == "long" and c in (8, 16):
        checks += [("PD / 2 mixed throughput", ratio("pd", "mixed2"), ">=", 1.0),
                   ("PD / 2 mixed ITL p99", ratio("pd", "mixed2", itl99), "<=", 0.5)]
    checks.append(("PD same slots / 2 mixed ITL p99", ratio("pd-same", "mixed2", itl99), "<=", 1.0))
    ratios = [name for name in ("pd", "pd-1p2d", "pd-2p1d") if name in best]
    if prompts == "long" and c == 16 and ratios and "mixed2" in best:
        fastest = max(ratios, key=lambda name: _rate(best[name]))
        label = DEPLOYMENTS[fastest][0]
        checks += [(f"best P:D ({label}) / 2 mixed throughput", ratio(fastest, "mixed2"), ">=", 1.0),
                   (f"best P:D ({label}) / 2 mixed ITL p99", ratio(fastest, "mixed2", itl99), "<=", 0.8)]
    for what, measured, op, bound in checks:
        if measured is not None:
            value, *levels = measured
            print(f"target at C = {c}: {what} = {value:.2f} {_judged(value, op, bound, *levels)}")


def print_prefix_cache_targets(c: int, best: dict[str, Level], workload: str) -> None:
    """docs/benchmarks.md "Prefix caching" targets: with sharing, TTFT p50 cached <= 0.5 x uncached and throughput
    >= 1.3 x; without sharing (random), the cache costs <= 3 % throughput. (multiturn has no target.)"""
    if workload not in ("shared", "random"):
        return
    for name in best:
        off = best.get(name + NO_CACHE)
        if off is None:
            continue
        on, label = best[name], _label(name)[0]
        checks = [(f"{label} cached / no-cache throughput", _rate(on) / _rate(off), ">=",
                   1.3 if workload == "shared" else 0.97)]
        if workload == "shared":
            checks.append((f"{label} cached / no-cache TTFT p50", _pct(on.ttft_s, 50) / _pct(off.ttft_s, 50), "<=",
                           0.5))
        for what, value, op, bound in checks:
            print(f"target at C = {c}: {what} = {value:.2f} {_judged(value, op, bound, on, off)}")


def start_targets(args, flags: list[str]) -> tuple[dict, dict, dict]:
    """(in-process LLMs by name, started services by name, every deployment to run by name in order); with
    --compare-prefix-caching each deployment also as "<name> no-cache"."""
    variants = [("", [], True)] + ([(NO_CACHE, ["--no-enable-prefix-caching"], False)]
                                   if args.compare_prefix_caching else [])
    llms, started, targets = {}, {}, {}
    for suffix, extra, cache in variants:
        if "in-process" in args.deployments:
            from fastdeploy import LLM
            spec = {"method": "mtp", "num_speculative_tokens": args.mtp} if args.mtp else None
            llms["in-process" + suffix] = LLM(model=args.model, speculative_config=spec,
                                              max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                                              enable_prefix_caching=cache)
        try:
            started.update({name + suffix: t for name, t in start_deployments(args, flags + extra).items()})
        except BaseException:
            stop_deployments(started)
            raise
    for name in (n for n in DEPLOYMENTS if n in args.deployments):
        targets.update({name + suffix: started.get(name + suffix) for suffix, _, _ in variants})
    return llms, started, targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="fd-tiny", choices=("fd-tiny", "fd-toy"))
    parser.add_argument("--mtp", type=int, default=1, metavar="K", help="MTP drafts per round (0: none)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    parser.add_argument("--max-prompt-words", type=int, default=24)
    parser.add_argument("--long-prompt-words", type=int, default=60, help="prompt length of the long prompts")
    parser.add_argument("--min-output", type=int, default=16)
    parser.add_argument("--max-output", type=int, default=96)
    parser.add_argument("--burst-output", type=int, default=64, help="output tokens of every bursty request")
    parser.add_argument("--max-num-seqs", type=int, default=8, help="slots per instance (the launch default)")
    parser.add_argument("--decode-slots", type=int, default=None, help="PD's D slots (default: 2 x --max-num-seqs)")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per side; the fastest is shown")
    parser.add_argument("--deployments", nargs="+", choices=tuple(DEPLOYMENTS), default=list(DEPLOYMENTS))
    parser.add_argument("--workloads", nargs="+", choices=("random", "bursty", "shared", "multiturn"),
                        default=["random", "bursty"])
    parser.add_argument("--system-prompt-chars", type=int, default=200, help="shared: system prompt tokens")
    parser.add_argument("--turns", type=int, default=4, help="multiturn: turns per conversation")
    parser.add_argument("--compare-prefix-caching", action="store_true",
                        help="run every deployment with and without the prefix cache")
    parser.add_argument("--prompts", nargs="+", choices=("short", "long"), default=["long", "short"])
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)   # one INFO line per request otherwise
    flags = ["--max-model-len", str(args.max_model_len), "--log-level", "warning"]
    if args.mtp:
        flags += ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": args.mtp})]
    llms, started, targets = start_targets(args, flags)
    print(f"model {args.model}, MTP K = {args.mtp}, {args.requests} requests per level, {args.max_num_seqs} slots per "
          f"instance (PD's D {args.decode_slots or 2 * args.max_num_seqs}), seed {args.seed}, load average "
          f"{os.getloadavg()[0]:.1f} at start")
    try:
        warm_up = make_jobs(args, "random", "short")[:4]   # the first requests pay one-time costs
        for name, target in targets.items():
            run_level(name.removesuffix(NO_CACHE), target, llms.get(name), warm_up, 4, "random", args)
        for prompts in args.prompts:
            for workload in args.workloads:
                jobs = make_jobs(args, workload, prompts)
                lengths = f"{args.burst_output}" if workload == "bursty" else f"{args.min_output}..{args.max_output}"
                print(f"\n{workload} workload, {prompts} prompts, outputs {lengths} tokens\n{HEADER}")
                for c in args.concurrency:
                    # alternate the deployments, `--repeats` times, and keep each one's fastest quiet run (its
                    # load read from /proc: the fastest run alone may still be a loaded one)
                    runs: dict[str, list[Level]] = {name: [] for name in targets}
                    for _ in range(args.repeats):
                        for name, target in targets.items():
                            runs[name].append(run_level(name.removesuffix(NO_CACHE), target, llms.get(name), jobs,
                                                        c, workload, args))
                    best = {name: best_run(levels) for name, levels in runs.items()}
                    print_level(c, best)
                    print_targets(c, best, prompts)
                    print_prefix_cache_targets(c, best, workload)
    finally:
        stop_deployments(started)


if __name__ == "__main__":
    main()
