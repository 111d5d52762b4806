"""Raw pyzmq loopback bandwidth: the ceiling the P->D hand-off is compared with (SERVICES §9).

P binds a ROUTER on 127.0.0.1 and sends each message (a small header frame plus one large zero-copy frame, like a
hand-off with its KV) to a DEALER in another process (D, as in the services), which receives it without a copy and
acknowledges it; the figure is payload bytes per second from each send to its acknowledgement.

    python benchmarks/zmq_loopback.py [--mib 4] [--messages 64]
"""
from __future__ import annotations

import argparse
import multiprocessing
import time

import numpy as np
import zmq

WAIT_MS = 60_000


def _receiver(address: str, count: int, out) -> None:
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 1000)
    dealer.connect(address)
    received = []
    try:
        dealer.send(b"ready")
        for _ in range(count):
            if not dealer.poll(WAIT_MS):
                raise RuntimeError("zmq_loopback: no message within the wait")
            dealer.recv_multipart(copy=False)
            received.append(time.perf_counter())
            dealer.send(b"ack")
        out.put(received)
    finally:
        dealer.close()
        context.term()


def raw_round_trips(payload_bytes: int, count: int, seed: int = 0) -> tuple[list[float], list[float]]:
    """(send-to-ack durations, send-to-received latencies) of `count` messages of `payload_bytes` each, to a
    receiver process (CLOCK_MONOTONIC is shared by the processes)."""
    if payload_bytes < 1 or count < 1:
        raise ValueError("raw_round_trips: 'payload_bytes' and 'count' must be >= 1")
    payload = np.random.default_rng(seed).integers(0, 255, payload_bytes, dtype=np.uint8)
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    child = spawn.Process(target=_receiver, args=(f"tcp://127.0.0.1:{port}", count, out), daemon=True)
    child.start()
    durations, starts = [], []
    try:
        if not router.poll(WAIT_MS):
            raise RuntimeError("zmq_loopback: the receiver did not connect")
        identity, _ = router.recv_multipart()
        for _ in range(count):
            start = time.perf_counter()
            router.send_multipart([identity, b"header", payload], copy=False)
            if not router.poll(WAIT_MS):
                raise RuntimeError("zmq_loopback: no acknowledgement within the wait")
            router.recv_multipart()
            starts.append(start)
            durations.append(time.perf_counter() - start)
        received = out.get(timeout=WAIT_MS / 1000)
    finally:
        child.join(timeout=WAIT_MS / 1000)
        if child.is_alive():
            child.kill()
        router.close()
        context.term()
    return durations, [r - s for s, r in zip(starts, received)]


def measure_loopback_bandwidth(payload_bytes: int = 4 << 20, messages: int = 64, seed: int = 0) -> float:
    """Bytes per second moved to the receiver process, each message acknowledged."""
    durations, _ = raw_round_trips(payload_bytes, messages, seed)
    return payload_bytes * messages / sum(durations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--mib", type=float, default=4.0, help="payload per message, MiB")
    parser.add_argument("--messages", type=int, default=64, help="messages to send")
    args = parser.parse_args()
    size = int(args.mib * (1 << 20))
    bandwidth = measure_loopback_bandwidth(size, args.messages)
    print(f"| payload per message | messages | loopback bandwidth |\n|---|---|---|\n"
          f"| {args.mib:g} MiB | {args.messages} | {bandwidth / (1 << 30):.2f} GiB/s |")


if __name__ == "__main__":
    main()
