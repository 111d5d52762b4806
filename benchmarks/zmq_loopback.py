"""Raw pyzmq loopback bandwidth: the ceiling the P->D hand-off is compared with (SERVICES §9).

P binds a ROUTER on 127.0.0.1 and sends each message (a small header frame plus one large zero-copy frame, like a
hand-off with its KV) to a DEALER in another process (D, as in the services), which receives it without a copy and
acknowledges it; the figure is payload bytes per second from each send to its acknowledgement. With `piece_bytes`
(`raw_round_trips`) the payload goes as messages of that size doing the streamed hand-off's own work around the
socket and nothing else: P hashes each piece (keyed BLAKE3) before sending it, D hashes it and copies it into a
buffer of its own — the floor of that work on this machine, without the connector's messages, tags and receipt.
With `curve_secret` both sockets speak CurveZMQ with that PD secret's keys (fastdeploy/splitwise/peer_auth.py), as
the connector's do with a secret: what the transport's authentication and encryption cost on their own.

    python benchmarks/zmq_loopback.py [--mib 4] [--messages 64]
"""
from __future__ import annotations

import argparse
import multiprocessing
import time

import blake3
import numpy as np
import zmq

WAIT_MS = 60_000


KEY = b"zmq-loopback-key-32-bytes-long!!"


def _curve_keys(secret: bytes | None):
    from fastdeploy.splitwise.peer_auth import CurveKeys
    return None if secret is None else CurveKeys.from_secret(secret)


def _receiver(address: str, count: int, pieces: int, work: bool, out, curve_secret: bytes | None = None) -> None:
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    if curve_secret is not None:
        _curve_keys(curve_secret).make_client(dealer)
    dealer.setsockopt(zmq.LINGER, 1000)
    dealer.connect(address)
    received, landing = [], None
    try:
        dealer.send(b"ready")
        for _ in range(count):
            hasher, offset = blake3.blake3(key=KEY), 0
            for _ in range(pieces):
                if not dealer.poll(WAIT_MS):
                    raise RuntimeError("zmq_loopback: no message within the wait")
                data = dealer.recv_multipart(copy=False)[-1].buffer
                if work:   # what D does with a piece: hash it, write it where it lands
                    hasher.update(data)
                    landing = np.empty(pieces * data.nbytes, np.uint8) if landing is None else landing
                    landing[offset:offset + data.nbytes] = np.frombuffer(data, np.uint8)
                    offset += data.nbytes
            hasher.hexdigest()
            received.append(time.perf_counter())
            dealer.send(b"ack")
        out.put(received)
    finally:
        dealer.close()
        context.term()


def raw_round_trips(payload_bytes: int, count: int, seed: int = 0, piece_bytes: int | None = None,
                    curve_secret: bytes | None = None) -> tuple[list[float], list[float]]:
    """(send-to-ack durations, send-to-received latencies) of `count` messages of `payload_bytes` each, to a
    receiver process (CLOCK_MONOTONIC is shared by the processes); with `piece_bytes`, each payload as pieces of
    that size, hashed on both sides and copied on D's (see the module's docstring)."""
    if payload_bytes < 1 or count < 1:
        raise ValueError("raw_round_trips: 'payload_bytes' and 'count' must be >= 1")
    work = piece_bytes is not None
    piece = min(piece_bytes, payload_bytes) if work else payload_bytes
    pieces = -(-payload_bytes // piece)
    payload = np.random.default_rng(seed).integers(0, 255, payload_bytes, dtype=np.uint8)
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    if curve_secret is not None:
        _curve_keys(curve_secret).make_server(router)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    child = spawn.Process(target=_receiver, args=(f"tcp://127.0.0.1:{port}", count, pieces, work, out, curve_secret),
                          daemon=True)
    child.start()
    durations, starts = [], []
    try:
        if not router.poll(WAIT_MS):
            raise RuntimeError("zmq_loopback: the receiver did not connect")
        identity, _ = router.recv_multipart()
        for _ in range(count):
            start = time.perf_counter()
            hasher = blake3.blake3(key=KEY)
            for i in range(pieces):
                data = memoryview(payload)[i * piece:(i + 1) * piece]
                if work:
                    hasher.update(data)
                router.send_multipart([identity, b"header", data], copy=False)
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
