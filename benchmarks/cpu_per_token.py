"""Service CPU per output token against the in-process engine: the one measure of docs/benchmarks.md ("Service CPU
per token"), with the code of benchmarks/serving.py (the same jobs, clients, /proc accounting and load reading), so
the two cannot disagree.

    service CPU per token  = CPU seconds (utime + stime, /proc) of the API server and its engine core over the level
                             / output tokens of the level
    in-process per token   = CPU seconds of this process (time.process_time: the engine and its driver loop)
                             / the same output tokens
    workload               = --model fd-toy, MTP K = 1, 8 slots, random workload, short prompts, outputs 16..96
                             forced (min_tokens = max_tokens), 64 requests, C = 16, greedy, seed 0

The clients (this process's asyncio HTTP clients) are not the service's CPU and are not counted. Each repeat runs
both sides in turn; a repeat taken while more than 5 % of the machine went elsewhere (benchmarks/load.py) is marked
and its ratio is not a result.

--profile DIR runs the service once more under cProfile (its API server and engine core, through a sitecustomize on
PYTHONPATH) and prints each process's functions by own time: what bounds the service's CPU per token.

    PYTHONPATH=. python benchmarks/cpu_per_token.py [--model fd-toy] [--concurrency 16] [--requests 64] [--repeats 2]
        [--profile /tmp/fd-profile]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pstats
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.load import ratio_text  # noqa: E402
from benchmarks.serving import make_jobs, run_level  # noqa: E402
from tests.services import launcher  # noqa: E402

# Brought to the service's processes through PYTHONPATH: SIGUSR1 starts a CPU-time profile of the main thread (the
# API server's event loop, the engine core's step loop), SIGUSR2 stops it and writes it out.
PROFILE_SITE = '''
import cProfile, os, signal, sys, time

_profile = cProfile.Profile(time.process_time)


def _start(*_):
    _profile.enable()


def _dump(*_):
    _profile.disable()
    role = "engine-core" if "engine_core" in (sys.argv[0] if sys.argv else "") else "api-server"
    _profile.dump_stats(os.path.join(os.environ["FD_CPROFILE_DIR"], f"{role}-{os.getpid()}.prof"))


signal.signal(signal.SIGUSR1, _start)
signal.signal(signal.SIGUSR2, _dump)
'''


def workload_args(args) -> argparse.Namespace:
    """serving.py's arguments for this measure's workload."""
    return argparse.Namespace(model=args.model, seed=0, requests=args.requests, max_prompt_words=24,
                              long_prompt_words=60, min_output=16, max_output=96, burst_output=64)


def service_flags(args) -> list[str]:
    return ["--max-model-len", "512", "--log-level", "warning", "--max-num-seqs", "8",
            "--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": args.mtp})]


def measure(args) -> None:
    from fastdeploy import LLM
    llm = LLM(model=args.model, speculative_config={"method": "mtp", "num_speculative_tokens": args.mtp},
              max_num_seqs=8, max_model_len=512)
    server = launcher.start(*service_flags(args), model=args.model)
    try:
        jobs = make_jobs(workload_args(args), "random", "short")
        warm = jobs[:4]
        run_level("in-process", None, llm, warm, 4, "random", workload_args(args))
        run_level("service", server, None, warm, 4, "random", workload_args(args))
        print(f"{args.model}, MTP K = {args.mtp}, 8 slots, random workload, short prompts, {args.requests} requests, "
              f"C = {args.concurrency}")
        print("| repeat | in-process CPU ms/tok | service CPU ms/tok | api | core | service / in-process | "
              "elsewhere (in-process, service) |\n|---:|---:|---:|---:|---:|---:|---|")
        for repeat in range(args.repeats):
            alone = run_level("in-process", None, llm, jobs, args.concurrency, "random", workload_args(args))
            served = run_level("service", server, None, jobs, args.concurrency, "random", workload_args(args))
            assert served.tokens == alone.tokens, (served.tokens, alone.tokens)
            per = {name: 1e3 * s / served.tokens for name, s in served.cpu_s.items()}
            ratio = served.cpu_ms_per_token() / alone.cpu_ms_per_token()
            print(f"| {repeat + 1} | {alone.cpu_ms_per_token():.3f} | {served.cpu_ms_per_token():.3f} | "
                  f"{per.get('api', 0):.3f} | {per.get('core', 0):.3f} | "
                  f"{ratio_text(ratio, alone.load, served.load)} | "
                  f"{alone.load.describe()}, {served.load.describe()} |", flush=True)
    finally:
        launcher.stop(server)


def profile(args) -> None:
    """One service level under cProfile; prints each process's top functions by own time."""
    directory = Path(args.profile)
    directory.mkdir(parents=True, exist_ok=True)
    site = directory / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(PROFILE_SITE)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH")))),
           "FD_CPROFILE_DIR": str(directory)}
    server = launcher.start(*service_flags(args), model=args.model, env=env)
    try:
        jobs = make_jobs(workload_args(args), "random", "short")
        run_level("service", server, None, jobs[:4], 4, "random", workload_args(args))   # warm-up, not profiled
        processes = (server.process.pid, server.engine_core_pid())
        for pid in processes:
            os.kill(pid, signal.SIGUSR1)
        level = run_level("service", server, None, jobs, args.concurrency, "random", workload_args(args))
        for pid in processes:
            os.kill(pid, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while len(list(directory.glob("*.prof"))) < len(processes) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        launcher.stop(server)
    print(f"\nprofiled level: {level.tokens} output tokens, {level.load.describe()} (CPU time of each process's main "
          "thread; cProfile inflates it: read the shares, not the times)")
    for path in sorted(directory.glob("*.prof")):
        stats = pstats.Stats(str(path))
        print(f"\n== {path.name}: {stats.total_tt:.2f} s profiled, "
              f"{1e3 * stats.total_tt / level.tokens:.3f} ms per output token; top {args.top} by own time")
        rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:args.top]
        for (file, line, function), (_, calls, own, cumulative, _) in rows:
            where = f"{Path(file).name}:{line}" if line else file
            print(f"{100 * own / stats.total_tt:5.1f} %  {own:7.3f} s own  {cumulative:7.3f} s cum  {calls:>8} calls  "
                  f"{function} ({where})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="fd-toy", choices=("fd-tiny", "fd-toy"))
    parser.add_argument("--mtp", type=int, default=1, metavar="K")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile", metavar="DIR", default=None, help="also profile one service level into DIR")
    parser.add_argument("--top", type=int, default=25, help="functions shown per profiled process")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)   # one INFO line per request otherwise
    if args.repeats:
        measure(args)
    if args.profile:
        profile(args)


if __name__ == "__main__":
    main()
