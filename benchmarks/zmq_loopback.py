"""Raw pyzmq loopback bandwidth: the ceiling the P->D hand-off is compared with (SERVICES §9).

A DEALER sends multipart messages (a small header frame plus one large zero-copy frame, like a hand-off with its
KV arrays) to a ROUTER on 127.0.0.1 over TCP, in another thread, which acknowledges each message; the figure is
payload bytes per second of wall time, acknowledgements included, as the hand-off is measured.

    python benchmarks/zmq_loopback.py [--mib 4] [--messages 64]
"""
from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import zmq


def measure_loopback_bandwidth(payload_bytes: int = 4 << 20, messages: int = 64, seed: int = 0) -> float:
    """Bytes per second moved from one socket to another on loopback, each message acknowledged."""
    if payload_bytes < 1 or messages < 1:
        raise ValueError("measure_loopback_bandwidth: 'payload_bytes' and 'messages' must be >= 1")
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    payload = np.random.default_rng(seed).integers(0, 255, payload_bytes, dtype=np.uint8)

    def receive_and_ack():
        for _ in range(messages):
            identity, _header, _data = router.recv_multipart(copy=False)
            router.send_multipart([identity, b"ack"])

    receiver = threading.Thread(target=receive_and_ack, daemon=True)
    receiver.start()
    try:
        start = time.perf_counter()
        for _ in range(messages):
            dealer.send_multipart([b"header", payload], copy=False)
            if dealer.poll(30_000) == 0:
                raise RuntimeError("measure_loopback_bandwidth: no acknowledgement within 30 s")
            dealer.recv()
        elapsed = time.perf_counter() - start
    finally:
        receiver.join(timeout=30)
        dealer.close()
        router.close()
        context.term()
    return payload_bytes * messages / elapsed


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
