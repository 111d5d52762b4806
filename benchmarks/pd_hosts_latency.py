"""TTFT and ITL of PD across hosts against the same PD on one host, at C concurrent streams (SERVICES §9; issue
"PD across hosts", performance).

Across hosts: the router, P and D each on a host of the hosts harness (network namespaces on a private bridge,
tests/hosts/netns.py and deployment.py; needs root, `ip`, `tc`, `nft`), the clients on the router's host, links
unshaped. On one host: the same router, P and D on 127.0.0.1 (tests/services/deployment.py). Both with the same
model and MTP K, over the zmq connector and over Mooncake TCP. Every deployment gets an untimed round of C
concurrent requests first, then C clients stream completions (closed loop) until the jobs are done: the same prompts and output lengths for
every deployment (greedy, min_tokens = max_tokens), counted as vLLM's `benchmark_serving` counts
(benchmarks/serving.py): TTFT is the request sent to its first content chunk, ITL the gap before each later chunk
(MTP emits several tokens per chunk at times).

"ratio" is across hosts over one host (p99s). Both sides run on this one machine, so the hosts' network is a veth
bridge in the same kernel: the ratio shows what the routed, non-loopback path costs, not a real network's latency.
`elsewhere` is the share of the machine other processes took during each run (benchmarks/load.py: one host /
across hosts); above 5 % a run is loaded and its ratio is printed in parentheses, not a result.

    sudo python benchmarks/pd_hosts_latency.py [--model fd-tiny] [--mtp 1] [--concurrency 8] [--requests 32]
                                              [--output-tokens 64] [--prompt-words 60]
                                              [--transports zmq mooncake-tcp] [--smoke]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.load import QUIET_SHARE, LoadMeter, LoadReading, ratio_text  # noqa: E402
from benchmarks.serving import WORDS, Job, Level, _pct, stream_batches  # noqa: E402

WAIT_S = 600.0   # bound of one run's streams (a hang becomes an error)


def make_jobs(requests: int, prompt_words: int, output_tokens: int, seed: int = 0) -> list[Job]:
    """`requests` prompts of prompt_words ± 10 % words, each `output_tokens` long (the same for every side)."""
    rng = random.Random(seed)
    low, high = max(1, int(prompt_words * 0.9)), max(1, int(prompt_words * 1.1))
    return [Job(" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))), output_tokens)
            for _ in range(requests)]


def stream_level(url: str, model: str, jobs: list[Job], c: int) -> Level:
    """An untimed round of `c` jobs at once, then every job with `c` clients; run in the caller's thread (a host's
    namespace). The warm-up round keeps the slots' first concurrent use out of the measured TTFT."""
    async def main() -> Level:
        level = Level()
        limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S, limits=limits) as client:
            await stream_batches(client, model, [jobs[:c]], c, Level())   # warm-up: connections, every slot
            started = time.perf_counter()
            await stream_batches(client, model, [jobs], c, level)
            level.wall_s = time.perf_counter() - started
        return level
    return asyncio.run(main())


def _flags(args, transport: str) -> tuple[str, ...]:
    return ("--cache-transfer-protocol", transport) if transport != "zmq" else ()


def run_one_host(args, transport: str, jobs: list[Job]) -> tuple[Level, LoadReading]:
    from tests.services import deployment as deploy
    flags = _flags(args, transport)
    deployment = deploy.pd_deployment(model=args.model, k=args.mtp, prefill_flags=flags, decode_flags=flags)
    try:
        meter = LoadMeter()
        meter.start()
        level = stream_level(deployment.router.url, args.model, jobs, args.concurrency)
        return level, meter.stop()
    finally:
        with contextlib.redirect_stdout(sys.stderr):   # the processes' logs: stdout keeps the table
            deployment.stop()


def run_across_hosts(args, net, transport: str, jobs: list[Job]) -> tuple[Level, LoadReading]:
    from tests.hosts import deployment as hosts_deploy
    deployment = hosts_deploy.pd_across_hosts(net["router"], net["prefill"], net["decode"], k=args.mtp,
                                              model=args.model, flags=_flags(args, transport))
    try:
        deployment.await_ready()
        meter = LoadMeter()
        meter.start()
        level = deployment.client_host.call(stream_level, deployment.router.url, args.model, jobs, args.concurrency,
                                            timeout=WAIT_S + 60)
        return level, meter.stop()
    finally:
        with contextlib.redirect_stdout(sys.stderr):   # the processes' logs: stdout keeps the table
            deployment.stop()


def _pair(values: tuple[float, float], digits: int = 1) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


HEADER = ("| transport | C | requests | TTFT p50 ms (1 host / hosts) | TTFT p99 ms (1 host / hosts) | ratio | "
          "ITL p50 ms (1 host / hosts) | ITL p99 ms (1 host / hosts) | ratio | elsewhere (1 host / hosts) |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def row(transport: str, c: int, one: tuple[Level, LoadReading], hosts: tuple[Level, LoadReading]) -> str:
    (near, near_load), (far, far_load) = one, hosts
    ttft = (_pct(near.ttft_s, 50), _pct(far.ttft_s, 50)), (_pct(near.ttft_s, 99), _pct(far.ttft_s, 99))
    itl = (_pct(near.itl_s, 50), _pct(far.itl_s, 50)), (_pct(near.itl_s, 99), _pct(far.itl_s, 99))
    elsewhere = " / ".join(f"{r.elsewhere_share:.0%}{'!' if r.loaded else ''}" for r in (near_load, far_load))
    return (f"| {transport} | {c} | {far.requests} | {_pair(ttft[0])} | {_pair(ttft[1])} | "
            f"{ratio_text(ttft[1][1] / ttft[1][0], near_load, far_load)} | {_pair(itl[0])} | {_pair(itl[1])} | "
            f"{ratio_text(itl[1][1] / itl[1][0], near_load, far_load)} | {elsewhere} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="fd-tiny")
    parser.add_argument("--mtp", type=int, default=1, help="MTP K (num_speculative_tokens)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--prompt-words", type=int, default=60)
    parser.add_argument("--transports", nargs="+", default=["zmq", "mooncake-tcp"], choices=["zmq", "mooncake-tcp"])
    parser.add_argument("--smoke", action="store_true", help="C = 2, 2 requests of 8 tokens (a smoke run)")
    args = parser.parse_args()
    if args.smoke:
        args.concurrency, args.requests, args.output_tokens, args.prompt_words = 2, 2, 8, 8
    from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
    from tests.hosts import netns
    if (reason := netns.unavailable_reason()) is not None:
        sys.exit(f"pd_hosts_latency: cannot build hosts here: {reason}")
    transports = list(args.transports)
    if "mooncake-tcp" in transports and (reason := mooncake_unavailable_reason()) is not None:
        print(f"mooncake-tcp rows skipped: {reason}")
        transports.remove("mooncake-tcp")
    jobs = make_jobs(args.requests, args.prompt_words, args.output_tokens)
    rows, loaded = [], False
    with netns.Network(["router", "prefill", "decode"]) as net:
        for transport in transports:
            one = run_one_host(args, transport, jobs)
            hosts = run_across_hosts(args, net, transport, jobs)
            loaded |= one[1].loaded or hosts[1].loaded
            rows.append(row(transport, args.concurrency, one, hosts))
            print(f"{transport}: done", flush=True)
    print(f"{args.model}, MTP K = {args.mtp}, {args.requests} requests of ~{args.prompt_words} words and "
          f"{args.output_tokens} tokens, C = {args.concurrency}")
    print(HEADER)
    print("\n".join(rows))
    print("elsewhere: share of the machine other processes took during each run (benchmarks/load.py)"
          + (f"; above {QUIET_SHARE:.0%} in a run marked '!': its ratios are not results, re-run on a quiet machine"
             if loaded else ""))


if __name__ == "__main__":
    main()
