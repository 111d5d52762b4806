"""The hand-off across hosts, as a share of the link's rate (SERVICES §9; issue "PD across hosts", performance).

P and D run on two hosts of the hosts harness (network namespaces on a private bridge, tests/hosts/netns.py; needs
root, `ip`, `tc`, `nft`). P's link is shaped with `tbf` to each rate (both ways), and, with `--delay-ms`, every
connection between P and D goes through the harness's latency relay (tests/hosts/relay.py: that many ms one way,
each direction). Each row moves one hand-off at a time from P to D exactly as `benchmarks/handoff_bandwidth.py`
does on loopback (the same code: the zmq connector streaming from P's blocks, D writing into its own, with the PD
secret, or without one for `zmq-no-secret`; Mooncake TCP writing into D's blocks, then the placed header over the
connector), each acknowledged by D.

MiB/s is KV bytes over the time from P's start to D's acknowledgement, summed over the timed hand-offs (one
untimed warm-up); "x link" is that rate over the link's (tbf's rate in bytes per second: headers and the ack's
round trip are the hand-off's cost). The relay is a Python process thread: at high rates it, not the link, can be
the bottleneck (its own row without shaping shows its ceiling). `elsewhere` is the share of the machine other
processes took (benchmarks/load.py); above 5 % the row is loaded and its ratio is not a result.

    sudo python benchmarks/handoff_hosts.py [--rates 1gbit 10gbit] [--sizes-mib 16 128] [--delay-ms 0 5]
                                            [--paths zmq zmq-no-secret mooncake] [--quick]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handoff_bandwidth import LAYERS, ROW_FLOATS, SECRET, WAIT_S, _prefill_round_trips  # noqa: E402
from load import QUIET_SHARE, LoadMeter  # noqa: E402

_BITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
# --paths: (the row's label, the hand-off's path in handoff_bandwidth, the PD secret)
PATHS = {"zmq": ("zmq connector + secret", "zmq", SECRET), "zmq-no-secret": ("zmq connector", "zmq", None),
         "mooncake": ("mooncake tcp + secret", "mooncake", SECRET)}
# tbf's bucket: at least a few ms of the rate (a timer tick), or it cannot reach the rate at all
_BURST_S = 0.004


def rate_bits(rate: str) -> float:
    """'10gbit' -> 1e10; ValueError for anything else."""
    for unit, scale in _BITS.items():
        if rate.endswith(unit) and rate[:-len(unit)].replace(".", "", 1).isdigit():
            return float(rate[:-len(unit)]) * scale
    raise ValueError(f"handoff_hosts: a rate must be <number>kbit|mbit|gbit (got {rate!r})")


def measure(net, path: str, rate: str | None, size_mib: int, count: int, delay_ms: float) -> dict:
    """One row: `count` timed hand-offs (after one warm-up) of about `size_mib` MiB from host p to host d."""
    from tests.hosts.relay import Relay
    p, d = net["p"], net["d"]
    if rate is not None:
        burst = max(64 << 10, int(rate_bits(rate) / 8 * _BURST_S))
        p.set_rate(rate, burst=str(burst), latency="100ms")
    relays = [Relay(d, p, delay_ms / 1e3), Relay(p, d, delay_ms / 1e3)] if delay_ms else []
    try:
        num_tokens = max(size_mib * 2**20 // (LAYERS * ROW_FLOATS * 4), 1)
        nbytes = num_tokens * LAYERS * ROW_FLOATS * 4
        _, transfer_path, secret = PATHS[path]
        _, durations, _ = p.call(_prefill_round_trips, transfer_path, num_tokens, count + 1, secret,
                                 (p.address, d.address, lambda start: d.call(start, timeout=60)),
                                 timeout=WAIT_S * (count + 2))
    finally:
        for relay in relays:
            relay.close()
        p.clear_rate()
    mib_s = nbytes * (len(durations) - 1) / sum(durations[1:]) / 2**20
    link = rate_bits(rate) / 8 / 2**20 if rate is not None else float("nan")
    return {"size": nbytes, "mib_s": mib_s, "ratio": mib_s / link}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"],
                        help="tbf rates of P's link; 'none' for an unshaped row")
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--delay-ms", type=float, nargs="+", default=[0.0, 5.0],
                        help="one-way delay through the relay (0: no relay)")
    parser.add_argument("--paths", nargs="+", default=["zmq", "mooncake"], choices=list(PATHS),
                        help="zmq-no-secret: the zmq connector without a PD secret (no CURVE encryption, no keyed "
                             "tags), what the secret costs")
    parser.add_argument("--quick", action="store_true", help="one timed hand-off per row (a smoke run)")
    args = parser.parse_args()
    from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
    from tests.hosts import netns
    if (reason := netns.unavailable_reason()) is not None:
        sys.exit(f"handoff_hosts: cannot build hosts here: {reason}")
    paths = list(args.paths)
    if "mooncake" in paths and (reason := mooncake_unavailable_reason()) is not None:
        print(f"mooncake rows skipped: {reason}")
        paths.remove("mooncake")
    rates = [None if r == "none" else r for r in args.rates]
    for rate in rates:
        if rate is not None:
            rate_bits(rate)
    print("| path | link | one-way delay | KV per hand-off | MiB/s | x link | elsewhere |\n"
          "|---|---|---:|---:|---:|---:|---:|", flush=True)
    worst = 0.0
    with netns.Network(["p", "d"]) as net:
        for path in paths:
            for rate in rates:
                for delay_ms in args.delay_ms:
                    for size in args.sizes_mib:
                        count = 1 if args.quick else max(2, 256 // size)
                        meter = LoadMeter()
                        meter.start()
                        row = measure(net, path, rate, size, count, delay_ms)
                        share = meter.stop().elsewhere_share
                        worst = max(worst, share)
                        loaded = share > QUIET_SHARE
                        ratio = f"({row['ratio']:.2f}) loaded" if loaded else f"{row['ratio']:.2f}"
                        print(f"| {PATHS[path][0]} | "
                              f"{rate or 'unshaped'} | {delay_ms:g} ms | {row['size'] / 2**20:g} MiB | "
                              f"{row['mib_s']:.0f} | {ratio} | {share:.0%}{'!' if loaded else ''} |", flush=True)
    print(f"elsewhere: up to {worst:.0%} of the machine during one row (benchmarks/load.py)"
          + (" (loaded: the ratios are not results; re-run on a quiet machine)" if worst > QUIET_SHARE else ""))


if __name__ == "__main__":
    main()
