"""TTFT of good requests through a PD deployment while its connector sockets are flooded (docs/design.md §8,
"Floods"): a router + P + D on 127.0.0.1 (tests/services/deployment.py); for each phase — no flood, junk frames at
P's connector port, junk frames at D's DEALER from a "P" D was sent to, both, and `--dead` requests sent straight
to D paired with a P address where nothing listens (round 5: each used to hold one of D's 16 slots until the
reservation-ack deadline) — streamed requests run one after another for `--seconds`, and the table gives their
count and TTFT p50 / p90, with the junk frames each instance refused meanwhile (the proof the flood ran).

  python -m benchmarks.pd_flood_ttft --seconds 20          # the issue's 20 s
  python -m benchmarks.pd_flood_ttft --seconds 2           # a quick check
"""
from __future__ import annotations

import argparse
import statistics
import time

import httpx

from tests.services import deployment as deploy
from tests.services.flood import Flood, refused

PROMPT = "On Monday, Judy"
DEAD = "127.0.0.1:9"   # the discard port: nothing completes a connection there


def _ttft(url: str) -> float:
    started = time.perf_counter()
    body = {"model": "fd-toy", "prompt": PROMPT, "max_tokens": 8, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - started
    raise RuntimeError("the stream ended without a chunk")


def _settled(*servers) -> tuple[float, ...]:
    counts = None
    for _ in range(40):   # bounded: 20 s
        now = tuple(refused(server, "malformed") for server in servers)
        if now == counts:
            return now
        counts = now
        time.sleep(0.5)
    return counts


def _phase(deployment: deploy.Deployment, name: str, seconds: float) -> dict:
    prefill, decode = deployment.instances["prefill"], deployment.instances["decode"]
    before = _settled(prefill, decode)   # the previous phase's backlog of junk is read and counted first
    flood = Flood()
    try:
        if name.startswith("junk") and "P" in name:
            flood.junk_at_p(deployment)
        if name.startswith("junk") and "D" in name:
            flood.junk_at_d(deployment)
        if name.endswith("to a dead P"):
            flood.requests_to_d(decode, DEAD, int(name.split()[0]), f"dead-{time.monotonic_ns()}")
        ttfts, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            ttfts.append(_ttft(deployment.router.url))
    finally:
        flood.stop()
        flood.join()
    quantiles = statistics.quantiles(ttfts, n=10) if len(ttfts) > 1 else ttfts * 9
    return {"phase": name, "requests": len(ttfts), "p50_ms": 1000 * statistics.median(ttfts),
            "p90_ms": 1000 * quantiles[8], "refused_p": refused(prefill, "malformed") - before[0],
            "refused_d": refused(decode, "malformed") - before[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--dead", type=int, nargs="*", default=[64, 1000],
                        help="a phase per count: that many requests to D paired with a dead P")
    args = parser.parse_args()
    flags = ("--pd-timeout-secs", "10")
    deployment = deploy.pd_deployment(prefill_flags=flags, decode_flags=(*flags, "--max-num-seqs", "16"))
    try:
        _ttft(deployment.router.url)   # warm-up
        rows = [_phase(deployment, name, args.seconds) for name in
                ("no flood", "junk at P", "junk at D", "junk at P and D",
                 *(f"{count} requests to a dead P" for count in args.dead))]
    finally:
        deployment.stop()
    print("\n| phase | requests | TTFT p50 (ms) | TTFT p90 (ms) | junk refused by P | junk refused by D |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['phase']} | {row['requests']} | {row['p50_ms']:.1f} | {row['p90_ms']:.1f} | "
              f"{row['refused_p']:.0f} | {row['refused_d']:.0f} |")


if __name__ == "__main__":
    main()
