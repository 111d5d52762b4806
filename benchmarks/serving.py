"""The in-process LLM engine vs one mixed service (API server + engine core) on the same workload. Prints a table.

Workload: `--requests` requests with random prompt lengths (4..`--max-prompt-words` words) and random output
lengths (`--min-output`..`--max-output` tokens, forced with min_tokens = max_tokens so both sides emit the same
tokens), greedy, fixed seed. Each concurrency level is a closed loop: C clients, each sending its next request when
the previous one finished. The two sides run alternately `--repeats` times per level and each side's fastest run
is printed (on a shared machine the fastest run is the least disturbed one).

in-process   the same LLMEngine driven in this process: C requests in flight, one added as one finishes; token
             times are the end of the step that produced them
service      `python -m fastdeploy.entrypoints.openai.api_server` started by this script on 127.0.0.1, C asyncio
             clients streaming /v1/completions over HTTP; token times are SSE chunk arrivals at the client

req/s, out tok/s   finished requests and output tokens per second of wall time over the whole level
TTFT p50/p99 ms    request sent to first token
ITL p50/p99 ms     time between consecutive token arrivals of a request (a chunk of n tokens counts n - 1 zero
                   gaps: MTP emits several tokens per round)
ratio              service out tok/s / in-process out tok/s at the same concurrency

Usage: python benchmarks/serving.py [--model fd-tiny] [--mtp 1] [--concurrency 1 16 32] [--requests 64] [--repeats 3]
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


def workload(args) -> list[Job]:
    rng = random.Random(args.seed)
    return [Job(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, args.max_prompt_words))),
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


def _row(name: str, c: int, level: Level, ratio: str) -> str:
    return (f"| {name:<10} | {c:>3} | {level.requests / level.wall_s:6.2f} | {level.tokens / level.wall_s:8.1f} | "
            f"{_pct(level.ttft_s, 50):7.1f} | {_pct(level.ttft_s, 99):7.1f} | {_pct(level.itl_s, 50):6.2f} | "
            f"{_pct(level.itl_s, 99):6.2f} | {ratio:>5} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="fd-tiny", choices=("fd-tiny", "fd-toy"))
    parser.add_argument("--mtp", type=int, default=1, metavar="K", help="MTP drafts per round (0: none)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 32])
    parser.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    parser.add_argument("--max-prompt-words", type=int, default=24)
    parser.add_argument("--min-output", type=int, default=16)
    parser.add_argument("--max-output", type=int, default=96)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per side; the fastest is shown")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)   # one INFO line per request otherwise
    jobs = workload(args)
    flags = ["--max-num-seqs", str(args.max_num_seqs), "--max-model-len", str(args.max_model_len), "--log-level",
             "warning"]
    if args.mtp:
        flags += ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": args.mtp})]
    print(f"model {args.model}, MTP K = {args.mtp}, {args.requests} requests per level, prompts 4..."
          f"{args.max_prompt_words} words, outputs {args.min_output}..{args.max_output} tokens, seed {args.seed}")
    print("| deployment | C   | req/s  | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | ratio |")
    print("|------------|-----|--------|-----------|----------|----------|---------|---------|-------|")
    llm = make_engine(args)
    server = launcher.start(*flags, model=args.model)
    try:
        run_service(server, jobs[:4], 4, args)   # warm-up: the first requests pay one-time costs
        run_in_process(llm, jobs[:4], 4)
        for c in args.concurrency:
            # alternate the two, `--repeats` times, and keep each side's fastest run: the machine is shared, and
            # the fastest run is the one least disturbed by other load
            references, services = [], []
            for _ in range(args.repeats):
                references.append(run_in_process(llm, jobs, c))
                services.append(run_service(server, jobs, c, args))
            reference = max(references, key=lambda lv: lv.tokens / lv.wall_s)
            service = max(services, key=lambda lv: lv.tokens / lv.wall_s)
            ratio = (service.tokens / service.wall_s) / (reference.tokens / reference.wall_s)
            print(_row("in-process", c, reference, "1.00"))
            print(_row("service", c, service, f"{ratio:.2f}"), flush=True)
    finally:
        launcher.stop(server)


if __name__ == "__main__":
    main()
