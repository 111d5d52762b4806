"""Serving deployments side by side on the same workload: the in-process LLM engine, one mixed service, two mixed
services behind the router, and PD services (router + P + D). Prints tables with ratios, and the hand-off bandwidth.

Workloads: `--requests` requests with random prompt lengths and random output lengths (`--min-output`..
`--max-output` tokens, forced with min_tokens = max_tokens so every side emits the same tokens), greedy, fixed
seed. *short* prompts have 4..`--max-prompt-words` words; *long* prompts `--long-prompt-words` words (the case PD
exists for: long prefills no longer stall other requests' decoding). Each concurrency level is a closed loop: C
clients, each sending its next request when the previous one finished. The deployments run alternately
`--repeats` times per level and each one's fastest run is printed (on a shared machine the fastest run is the least
disturbed one).

in-process   the same LLMEngine driven in this process: C requests in flight, one added as one finishes; token
             times are the end of the step that produced them
service      `python -m fastdeploy.entrypoints.openai.api_server` started by this script on 127.0.0.1, C asyncio
             clients streaming /v1/completions over HTTP; token times are SSE chunk arrivals at the client
2 mixed      `python -m fastdeploy.router.launch` with two mixed services registered, the same clients on the router
PD           `python -m fastdeploy.router.launch --splitwise` with one prefill and one decode service (the same
             number of engine processes as "2 mixed"), the same clients on the router

req/s, out tok/s   finished requests and output tokens per second of wall time over the whole level
TTFT p50/p99 ms    request sent to first token
ITL p50/p99 ms     time between consecutive token arrivals of a request (a chunk of n tokens counts n - 1 zero
                   gaps: MTP emits several tokens per round)
ratio, vs          out tok/s over that of the deployment named in "vs" at the same concurrency; for PD also ITL p99
                   over 2 mixed's

The hand-off table: mean KV bytes per hand-off from P's /metrics after the PD runs, then the connector
(`benchmarks/handoff_bandwidth.py`) and raw pyzmq loopback moving hand-offs of that size, in this same run.

Usage: python benchmarks/serving.py [--model fd-tiny] [--mtp 1] [--concurrency 1 16 32] [--requests 64] [--repeats 3]
       [--deployments in-process service mixed2 pd] [--workloads short long]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import logging

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "benchmarks"))

from handoff_bandwidth import compare as compare_handoff_bandwidth  # noqa: E402
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
    itl_s: list[float] = field(default_factory=list)

    def record(self, sent: float, arrivals: list[tuple[float, int]]) -> None:
        """`arrivals`: (time, tokens in that arrival) of one request."""
        self.requests += 1
        self.tokens += sum(n for _, n in arrivals)
        self.ttft_s.append(arrivals[0][0] - sent)
        previous = arrivals[0][0]
        for t, n in arrivals[1:]:
            self.itl_s += [t - previous] + [0.0] * (n - 1)
            previous = t
        self.itl_s += [0.0] * (arrivals[0][1] - 1)


def workload(args, kind: str = "short") -> list[Job]:
    """`kind` "short": 4..--max-prompt-words words; "long": --long-prompt-words words (± 10 %)."""
    rng = random.Random(args.seed)
    low, high = (4, args.max_prompt_words) if kind == "short" else \
        (int(args.long_prompt_words * 0.9), int(args.long_prompt_words * 1.1))
    return [Job(" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))),
                rng.randint(args.min_output, args.max_output)) for _ in range(args.requests)]


def make_engine(args):
    from fastdeploy import LLM
    spec = {"method": "mtp", "num_speculative_tokens": args.mtp} if args.mtp else None
    return LLM(model=args.model, speculative_config=spec, max_num_seqs=args.max_num_seqs,
               max_model_len=args.max_model_len)


def run_in_process(llm, jobs: list[Job], concurrency: int) -> Level:
    from fastdeploy import SamplingParams
    engine, level = llm.engine, Level()
    pending, live, ids = list(reversed(jobs)), {}, iter(range(len(jobs)))
    started = time.perf_counter()
    while pending or live:
        while pending and len(live) < concurrency:
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


def run_service(server: launcher.Server, jobs: list[Job], concurrency: int, args) -> Level:
    async def main() -> Level:
        level, queue = Level(), list(reversed(jobs))
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as client:
            async def worker():
                while queue:
                    await _stream_one(client, args.model, queue.pop(), level)

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            level.wall_s = time.perf_counter() - started
        return level

    return asyncio.run(main())


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return 1e3 * statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else 1e3 * values[0]


def _rate(level: Level) -> float:
    return level.tokens / level.wall_s


def _row(name: str, c: int, level: Level, ratio: float, versus: str) -> str:
    return (f"| {name:<10} | {c:>3} | {level.requests / level.wall_s:6.2f} | {_rate(level):8.1f} | "
            f"{_pct(level.ttft_s, 50):7.1f} | {_pct(level.ttft_s, 99):7.1f} | {_pct(level.itl_s, 50):6.2f} | "
            f"{_pct(level.itl_s, 99):6.2f} | {ratio:5.2f} | {versus:<10} |")


# (label, reference label for the ratio): services against the in-process engine, PD against 2 mixed
DEPLOYMENTS = {"in-process": ("in-process", "in-process"), "service": ("service", "in-process"),
               "mixed2": ("2 mixed", "in-process"), "pd": ("PD", "2 mixed")}


def start_deployments(args, flags: list[str]) -> dict[str, object]:
    """Every requested deployment, started at once and waited for together; keys as in DEPLOYMENTS."""
    started: dict[str, object] = {}
    try:
        if "service" in args.deployments:
            started["service"] = launcher.start(*flags, model=args.model, wait_ready=False)
        if "mixed2" in args.deployments:
            started["mixed2"] = deploy.mixed_deployment(model=args.model, flags=tuple(flags), wait=False)
        if "pd" in args.deployments:
            started["pd"] = deploy.pd_deployment(model=args.model, prefill_flags=tuple(flags),
                                                 decode_flags=tuple(flags), wait=False)
        for name, started_one in started.items():
            if name == "service":
                launcher.await_ready(started_one)
            else:
                started_one.await_ready()
    except BaseException:
        stop_deployments(started)
        raise
    return started


def stop_deployments(started: dict[str, object]) -> None:
    for name, started_one in started.items():
        launcher.stop(started_one) if name == "service" else started_one.stop()


def run_level(name: str, target, llm, jobs: list[Job], c: int, args) -> Level:
    if name == "in-process":
        return run_in_process(llm, jobs, c)
    return run_service(target if name == "service" else target.router, jobs, c, args)


def print_level(c: int, best: dict[str, Level]) -> None:
    for name, level in best.items():
        label, versus = DEPLOYMENTS[name]
        reference = best.get({"in-process": "in-process", "2 mixed": "mixed2"}[versus])
        ratio = _rate(level) / _rate(reference) if reference is not None else float("nan")
        print(_row(label, c, level, ratio, versus if reference is not None else "-"), flush=True)
    if "pd" in best and "mixed2" in best:
        print(f"PD / 2 mixed at C = {c}: throughput {_rate(best['pd']) / _rate(best['mixed2']):.2f}, ITL p99 "
              f"{_pct(best['pd'].itl_s, 99) / _pct(best['mixed2'].itl_s, 99):.2f}", flush=True)


def print_handoff_bandwidth(pd) -> None:
    metrics = pd.instances["prefill"].metrics()
    sent = metrics.get("fastdeploy:pd_handoffs_total{direction=sent}", 0.0)
    kv_bytes = metrics.get("fastdeploy:pd_kv_bytes_total{direction=sent}", 0.0)
    if not sent:
        print("no hand-off recorded on P: bandwidth not measured")
        return
    size = int(kv_bytes / sent)
    connector, raw = compare_handoff_bandwidth(size)
    print(f"\n{int(sent)} hand-offs, {kv_bytes / 2**20:.1f} MiB of KV in all\n"
          "| KV per hand-off | connector MiB/s | raw pyzmq MiB/s | connector / raw |\n|---|---:|---:|---:|\n"
          f"| {size / 1024:.1f} KiB | {connector / 2**20:.1f} | {raw / 2**20:.1f} | {connector / raw:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="fd-tiny", choices=("fd-tiny", "fd-toy"))
    parser.add_argument("--mtp", type=int, default=1, metavar="K", help="MTP drafts per round (0: none)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 32])
    parser.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    parser.add_argument("--max-prompt-words", type=int, default=24)
    parser.add_argument("--long-prompt-words", type=int, default=60, help="prompt length of the long workload")
    parser.add_argument("--min-output", type=int, default=16)
    parser.add_argument("--max-output", type=int, default=96)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per side; the fastest is shown")
    parser.add_argument("--deployments", nargs="+", choices=tuple(DEPLOYMENTS), default=list(DEPLOYMENTS))
    parser.add_argument("--workloads", nargs="+", choices=("short", "long"), default=["short", "long"])
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)   # one INFO line per request otherwise
    flags = ["--max-num-seqs", str(args.max_num_seqs), "--max-model-len", str(args.max_model_len), "--log-level",
             "warning"]
    if args.mtp:
        flags += ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": args.mtp})]
    llm = make_engine(args) if "in-process" in args.deployments else None
    started = start_deployments(args, flags)
    targets = {name: started.get(name) for name in DEPLOYMENTS if name in args.deployments}
    try:
        warm_up = workload(args)[:4]   # the first requests pay one-time costs
        for name, target in targets.items():
            run_level(name, target, llm, warm_up, 4, args)
        for kind in args.workloads:
            jobs = workload(args, kind)
            words = f"4..{args.max_prompt_words}" if kind == "short" else f"~{args.long_prompt_words}"
            print(f"\n{kind} prompts ({words} words): model {args.model}, MTP K = {args.mtp}, {args.requests} "
                  f"requests per level, outputs {args.min_output}..{args.max_output} tokens, seed {args.seed}")
            print("| deployment | C   | req/s  | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | ratio | vs         |")
            print("|------------|-----|--------|-----------|----------|----------|---------|---------|-------|------------|")
            for c in args.concurrency:
                # alternate the deployments, `--repeats` times, and keep each one's fastest run: the machine is
                # shared, and the fastest run is the one least disturbed by other load
                runs: dict[str, list[Level]] = {name: [] for name in targets}
                for _ in range(args.repeats):
                    for name, target in targets.items():
                        runs[name].append(run_level(name, target, llm, jobs, c, args))
                print_level(c, {name: max(levels, key=_rate) for name, levels in runs.items()})
        if "pd" in started:
            print_handoff_bandwidth(started["pd"])
    finally:
        stop_deployments(started)


if __name__ == "__main__":
    main()
