"""Hand-off bandwidth of the PD connector against raw pyzmq on loopback, at the same message size (SERVICES §9).

The connector (`ZmqTransport`, P listening here, D connected from a child process, as in the services) moves
`messages` real hand-offs of `payload_bytes` of KV each: D reserves, P seals a `HandoffMessage` (its integrity tag
over every KV byte) and sends its frames (keyed connector tag, zero-copy), D receives, decodes and verifies the
hand-off's tag as receipt step 1 does, and acknowledges; P sees the acknowledgement. The figure is KV bytes per
second from P's sealing to the acknowledgement, summed over hand-offs: every integrity cost of the path is in it. `zmq_loopback.measure_loopback_bandwidth` moves the same sizes over a bare
DEALER/ROUTER pair with the same acknowledgements, so the ratio is the connector's own cost.

    python benchmarks/handoff_bandwidth.py [--kib 256] [--messages 64]
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zmq_loopback import measure_loopback_bandwidth  # noqa: E402

from fastdeploy.splitwise.deadline import Deadline, MonotonicClock  # noqa: E402
from fastdeploy.splitwise.handoff import HandoffMessage, HandoffSamplingParams  # noqa: E402
from fastdeploy.splitwise.zmq_transport import ZmqTransport  # noqa: E402

PROMPT_TOKENS = 64
WAIT_S = 30.0  # far beyond a loopback message: only a broken connector reaches it


def _decode_side(prefill_addr: str, ids: list[str], secret: bytes, failures) -> None:
    """D in its own process, as in the services: reserve, receive, acknowledge, one hand-off at a time."""
    clock = MonotonicClock()
    decode = ZmqTransport(secret=secret)
    try:
        for rid in ids:
            decode.reserve(rid, prefill_addr)
            envelope = decode.poll(Deadline.after(clock, WAIT_S))
            if envelope is None:
                failures.put(f"D: no hand-off for {rid}")
                return
            message = HandoffMessage.decode(envelope.payload)
            if message.compute_tag() != message.tag:   # receipt step 1 (PD_MTP_FLOW §5.2)
                failures.put(f"D: hand-off {rid} failed its integrity tag")
                return
            decode.ack(envelope.request_id)
    finally:
        decode.close()


def measure_connector_bandwidth(payload_bytes: int, messages: int = 64, frames: int = 4, seed: int = 0) -> float:
    """KV bytes per second through ZmqTransport (P here, D in a child process), each hand-off's KV split into
    `frames` arrays; timed from each hand-off's sealing to its acknowledgement."""
    if payload_bytes < frames or messages < 1 or frames < 1:
        raise ValueError("measure_connector_bandwidth: need payload_bytes >= frames >= 1 and messages >= 1")
    clock = MonotonicClock()
    secret = b"benchmark-secret"
    # KV as a hand-off carries it: one [L, bytes per token] array per layer, L = PROMPT_TOKENS positions.
    per_token = max(payload_bytes // (frames * PROMPT_TOKENS), 1)
    rng = np.random.default_rng(seed)
    layers = [rng.integers(0, 255, (PROMPT_TOKENS, per_token), dtype=np.uint8) for _ in range(frames)]
    payload_bytes = sum(layer.nbytes for layer in layers)
    prefill = ZmqTransport(listen="127.0.0.1:0", secret=secret)
    ids = [f"bench-{i}" for i in range(messages)]
    context = multiprocessing.get_context("spawn")
    failures = context.Queue()
    receiver = context.Process(target=_decode_side, args=(prefill.address, ids, secret, failures), daemon=True)
    receiver.start()
    try:
        elapsed = 0.0
        for _ in ids:
            rid = prefill.poll_reservation(Deadline.after(clock, WAIT_S))
            if rid is None:
                raise RuntimeError("measure_connector_bandwidth: no reservation from D")
            start = time.perf_counter()
            message = HandoffMessage.create(request_id=rid, prompt_token_ids=list(range(PROMPT_TOKENS)),
                                            sampling=HandoffSamplingParams(max_tokens=8), t0=5,
                                            draft_token_ids=[5, 6], kv_target=layers, kv_mtp=[],
                                            config_hash="benchmark")
            prefill.send(rid, message.encode_frames())
            if prefill.poll_ack(Deadline.after(clock, WAIT_S)) != rid:
                raise RuntimeError(f"measure_connector_bandwidth: no acknowledgement for {rid}")
            elapsed += time.perf_counter() - start
    finally:
        receiver.join(timeout=WAIT_S)
        if receiver.is_alive():
            receiver.kill()
        prefill.close()
    return payload_bytes * messages / elapsed


def compare(payload_bytes: int, messages: int = 64) -> tuple[float, float]:
    """(connector, raw loopback) bytes per second at `payload_bytes` per message."""
    return measure_connector_bandwidth(payload_bytes, messages), measure_loopback_bandwidth(payload_bytes, messages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--kib", type=float, default=256.0, help="KV per hand-off, KiB")
    parser.add_argument("--messages", type=int, default=64)
    args = parser.parse_args()
    size = int(args.kib * 1024)
    connector, raw = compare(size, args.messages)
    print("| KV per hand-off | connector MiB/s | raw pyzmq MiB/s | connector / raw |\n|---|---:|---:|---:|\n"
          f"| {args.kib:g} KiB | {connector / 2**20:.1f} | {raw / 2**20:.1f} | {connector / raw:.2f} |")


if __name__ == "__main__":
    main()
