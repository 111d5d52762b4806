"""Hand-off bandwidth of the PD connector and the Mooncake transfer layer against raw pyzmq, one run (SERVICES §9).

Every row moves the same bytes from P (this process) to D (a child process, as in the services) on 127.0.0.1, one
hand-off at a time, each acknowledged by D:

raw pyzmq          one frame of the hand-off's size, DEALER/ROUTER, D acknowledges (zmq_loopback.py): the ceiling
raw pyzmq + curve  the same over CurveZMQ with the PD secret's keys, as the connector's sockets with a secret: what
                   the transport's authentication and encryption cost on their own
pyzmq + the work   the same bytes as 1 MiB messages, P hashing each before it is sent, D hashing it and copying it
                   into a buffer (zmq_loopback.py): the streamed hand-off's own work around the socket and nothing
                   else, the floor of the zmq connector on this machine
zmq connector      the real path, streamed (SERVICES §7): ZmqTransport's I/O thread sends the prompt's KV from P's
                   blocks (PromptKVPort) piece by piece without a copy, hashing each piece (the tag over every KV
                   byte) while the previous one is on the wire, then sends the tag in a trailer; D's I/O thread
                   hashes each piece and writes it into D's blocks as it arrives and compares the tag at the
                   trailer; D then runs the receipt (PD_MTP_FLOW §5.2) and acknowledges; without and with a PD
                   secret (keyed BLAKE3 and keyed connector tags)
mooncake tcp       D's reservation carries its block destinations; P writes the KV from its blocks straight into
                   D's (Mooncake transfer engine, TCP, one write per run of blocks consecutive on both sides, hashing
                   each layer while it is written), then sends the placed hand-off's header over ZmqTransport; D
                   verifies the tag over its own blocks; with a secret
mooncake tcp staged  the same, P first copying the KV into a slot of its staging pool and writing it from there,
                   hashing the slot (what a P instance does: docs/design.md §8)
memcpy floor       one in-memory copy of the same bytes in this process
blake3 keyed pass  one keyed BLAKE3 pass over the same bytes in this process (what each side of the connector adds)

MiB/s is KV bytes over the time from P's start (gather or write) to P seeing D's acknowledgement, summed over the
timed hand-offs (one untimed warm-up each); latency is the median from P's start to D having verified the hand-off
(CLOCK_MONOTONIC, shared by the processes). KV layout: 16 layers of 1 KiB per position, 64-position blocks. With
`--repeats R` every size runs R rounds over all rows, interleaved, and each row shows its fastest round.

    python benchmarks/handoff_bandwidth.py [--sizes-kib 64 1024 16384 131072] [--repeats 1] [--quick]
"""
from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from load import QUIET_SHARE, LoadMeter  # noqa: E402
from zmq_loopback import raw_round_trips  # noqa: E402

LAYERS, ROW_FLOATS, BLOCK_SIZE = 16, 256, 64
SECRET = b"benchmark-secret"
WAIT_S = 120.0  # far beyond one hand-off: only a broken path reaches it


def _port(num_tokens: int, seed: int | None):
    from fastdeploy.model_executor.layers.kv_cache import KVCache
    from fastdeploy.worker.kv_transfer import PromptKVPort
    blocks = -(-num_tokens // BLOCK_SIZE)
    port = PromptKVPort(KVCache(blocks + 1, BLOCK_SIZE, [(ROW_FLOATS,)] * LAYERS), num_target_layers=LAYERS)
    if seed is not None:
        rng = np.random.default_rng(seed)
        for i in range(LAYERS):
            view = port.kv.host_view(i)
            view[...] = rng.standard_normal(view.shape, dtype=np.float32)
    return port, list(range(1, blocks + 1))   # block 0 left free: ids need not start at 0


def _config(transport: str) -> str:
    from fastdeploy.splitwise import config_hash
    return config_hash(model_name="bench", vocab_size=64, num_speculative_tokens=1, mtp_model="bench/mtp",
                       block_size=BLOCK_SIZE, kv_dtype="float32", transport=transport)


def _decode_side(path: str, prefill_addr: str, num_tokens: int, count: int, secret: bytes | None, out,
                 hostname: str = "127.0.0.1") -> None:
    """D: reserve, receive, verify (and write the KV into its blocks), acknowledge; report when each verified
    (`hostname`: the address D's Mooncake segment advertises)."""
    from fastdeploy.splitwise import Deadline, Insert, MonotonicClock, receive_handoff
    from fastdeploy.splitwise.kv_stream import Landing
    from fastdeploy.splitwise.zmq_transport import ZmqTransport
    port, blocks = _port(num_tokens, None)
    transfer = None
    if path.startswith("mooncake"):
        from fastdeploy.splitwise.mooncake import MooncakeKVTransfer
        transfer = MooncakeKVTransfer.start(port, "tcp", hostname=hostname)
    transport, clock, verified = ZmqTransport(secret=secret), MonotonicClock(), []
    try:
        for i in range(count):
            data = transfer.reservation_data(blocks) if transfer is not None else None
            if transfer is None:
                transport.expect_kv(f"h{i}", Landing(port.prompt_kv_chunks(blocks, num_tokens)))
            transport.reserve(f"h{i}", prefill_addr, data=data)
            envelope = transport.poll(Deadline.after(clock, WAIT_S))
            verdict = receive_handoff(envelope.request_id, envelope.payload, config_hash=_config(
                "mooncake-tcp" if transfer else "zmq"), num_speculative_tokens=1, kv_layout=port.layout,
                key=transport.handoff_key, kv_in_place=transfer.in_place(blocks) if transfer else None,
                kv_landed=envelope.kv_landed)
            if not isinstance(verdict, Insert):
                raise RuntimeError(f"D: hand-off {envelope.request_id} not accepted: {verdict}")
            if verdict.message.kv_inline:
                port.write_prompt_kv(blocks, verdict.message.kv_target, verdict.message.kv_mtp)
            verified.append(time.perf_counter())
            transport.ack(envelope.request_id)
        out.put(verified)
        transport.poll(Deadline.after(clock, 0.2))   # the last ack leaves before the socket closes
    finally:
        transport.close()
        if transfer is not None:
            transfer.close()


def _prefill_round_trips(path: str, num_tokens: int, count: int, secret: bytes | None, hosts: tuple | None = None
                         ) -> tuple[list, list, list]:
    """P: `count` hand-offs through `path` ("zmq", "mooncake" or "mooncake-staged"); (P start times, P durations
    to the ack, D verified times). By default P and D are on 127.0.0.1; `hosts` = (P's address, D's address,
    start) puts them on two hosts: this call runs on P's (handoff_hosts.py), and `start(fn)` runs `fn` (D's
    process start) on D's."""
    p_address, d_address, start_on_d = hosts or ("127.0.0.1", "127.0.0.1", lambda fn: fn())
    from fastdeploy.splitwise import Deadline, HandoffMessage, HandoffSamplingParams, MonotonicClock
    from fastdeploy.splitwise.kv_stream import OutgoingStream
    from fastdeploy.splitwise.mooncake import Destination, MooncakeKVTransfer
    from fastdeploy.splitwise.zmq_transport import ZmqTransport
    port, blocks = _port(num_tokens, seed=0)
    staging_tokens = num_tokens if path == "mooncake-staged" else 0
    transfer = MooncakeKVTransfer.start(port, "tcp", hostname=p_address, staging_tokens=staging_tokens) \
        if path.startswith("mooncake") else None
    transport, clock = ZmqTransport(listen=f"{p_address}:0", secret=secret), MonotonicClock()
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    child = context.Process(target=_decode_side, args=(path, transport.address, num_tokens, count, secret, out,
                                                       d_address), daemon=True)
    start_on_d(child.start)
    starts, durations = [], []
    fields = dict(prompt_token_ids=list(range(num_tokens)), sampling=HandoffSamplingParams(max_tokens=8), t0=5,
                  draft_token_ids=[5, 6], key=transport.handoff_key)
    try:
        for _ in range(count):
            reservation = transport.poll_reservation_with_data(Deadline.after(clock, WAIT_S))
            start = time.perf_counter()
            if transfer is None:   # what PrefillConnector._stream does
                message = HandoffMessage.create_streamed(request_id=reservation.request_id,
                                                         placed_kv=port.placed_kv(num_tokens),
                                                         config_hash=_config("zmq"), **fields)
                transport.send_stream(reservation.request_id, OutgoingStream.of(
                    message, port.prompt_kv_chunks(blocks, num_tokens), transport.handoff_key))
            else:
                chunks = transfer.write_to(Destination.parse(reservation.data), blocks, num_tokens)
                message = HandoffMessage.create_placed(request_id=reservation.request_id,
                                                       placed_kv=port.placed_kv(num_tokens), kv_chunks=chunks,
                                                       config_hash=_config("mooncake-tcp"), **fields)
                transport.send(reservation.request_id, message.encode_frames())
            if transport.poll_ack(Deadline.after(clock, WAIT_S)) != reservation.request_id or \
                    any(error for _, error in transport.finished_sends()):
                raise RuntimeError(f"P: no acknowledgement for {reservation.request_id}")
            starts.append(start)
            durations.append(time.perf_counter() - start)
        return starts, durations, out.get(timeout=WAIT_S)
    finally:
        child.join(timeout=WAIT_S)
        if child.is_alive():
            child.kill()
        transport.close()
        if transfer is not None:
            transfer.close()


def _memcpy(nbytes: int, count: int) -> list[float]:
    source = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    target = np.ones_like(source)   # touched once, so no page faults inside the timed copies
    durations = []
    for _ in range(count):
        start = time.perf_counter()
        np.copyto(target, source)
        durations.append(time.perf_counter() - start)
    return durations


def _blake3_pass(nbytes: int, count: int) -> list[float]:
    from fastdeploy.splitwise import HandoffKey
    key, data = HandoffKey.from_secret(SECRET), np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    durations = []
    for _ in range(count):
        start = time.perf_counter()
        key.hasher({}, nbytes).update(data)
        durations.append(time.perf_counter() - start)
    return durations


def measure(size_bytes: int, count: int, paths: list[str]) -> list[dict]:
    """One row per path at about `size_bytes` of KV per hand-off (whole positions; count timed hand-offs after
    one warm-up)."""
    num_tokens = max(size_bytes // (LAYERS * ROW_FLOATS * 4), 1)
    nbytes = num_tokens * LAYERS * ROW_FLOATS * 4
    rows = []
    for path in paths:
        if path in ("raw pyzmq", "raw pyzmq + curve", "pyzmq + the work"):
            from fastdeploy.splitwise.kv_stream import PIECE_BYTES
            durations, latencies = raw_round_trips(nbytes, count + 1,
                                                   piece_bytes=PIECE_BYTES if path == "pyzmq + the work" else None,
                                                   curve_secret=SECRET if path == "raw pyzmq + curve" else None)
            durations, latencies = durations[1:], latencies[1:]
        elif path in ("memcpy floor", "blake3 keyed pass"):
            durations = (_memcpy if path == "memcpy floor" else _blake3_pass)(nbytes, count)
            latencies = durations
        else:
            kind = "zmq" if not path.startswith("mooncake") else "mooncake-staged" if "staged" in path else "mooncake"
            secret = SECRET if "secret" in path else None
            starts, durations, verified = _prefill_round_trips(kind, num_tokens, count + 1, secret)
            starts, durations, verified = starts[1:], durations[1:], verified[1:]
            latencies = [v - s for s, v in zip(starts, verified)]
        rows.append({"size": nbytes, "path": path, "mib_s": nbytes * len(durations) / sum(durations) / 2**20,
                     "latency_ms": statistics.median(latencies) * 1e3})
    raw = next((r["mib_s"] for r in rows if r["path"] == "raw pyzmq"), None)
    for row in rows:
        row["ratio"] = row["mib_s"] / raw if raw else float("nan")
    return rows


def compare(payload_bytes: int, messages: int = 64) -> tuple[float, float]:
    """(ZeroMQ connector with a secret, raw pyzmq) bytes per second at about `payload_bytes` per hand-off."""
    rows = {r["path"]: r for r in measure(payload_bytes, messages, ["raw pyzmq", "zmq connector + secret"])}
    return rows["zmq connector + secret"]["mib_s"] * 2**20, rows["raw pyzmq"]["mib_s"] * 2**20


PATHS = ["raw pyzmq", "raw pyzmq + curve", "pyzmq + the work", "zmq connector", "zmq connector + secret", "mooncake tcp + secret",
         "mooncake tcp staged + secret", "memcpy floor", "blake3 keyed pass"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[64, 1024, 16384, 131072])
    parser.add_argument("--quick", action="store_true", help="fewer hand-offs per size (a smoke run)")
    parser.add_argument("--paths", nargs="+", default=PATHS, choices=PATHS)
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds over every row per size; each row's fastest round is shown")
    args = parser.parse_args()
    from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
    paths = list(args.paths)
    if (reason := mooncake_unavailable_reason()) is not None:
        print(f"mooncake rows skipped: {reason}")
        paths = [p for p in paths if not p.startswith("mooncake")]
    print("| KV per hand-off | path | MiB/s | x raw pyzmq | latency p50 ms |\n|---|---|---:|---:|---:|")
    meter, worst_share = LoadMeter(), 0.0
    for size in args.sizes_kib:
        count = max(2, min(64, (64 << 10) // size)) if args.quick else max(4, min(128, (512 << 10) // size))
        meter.start()
        rounds = [measure(size * 1024, count, paths) for _ in range(args.repeats)]
        worst_share = max(worst_share, meter.stop().elsewhere_share)
        best = [max(same, key=lambda r: r["mib_s"]) for same in zip(*rounds)]
        raw = next((r["mib_s"] for r in best if r["path"] == "raw pyzmq"), float("nan"))
        for row in best:
            row["ratio"] = row["mib_s"] / raw
            label = f"{row['size'] / 2**20:g} MiB" if row["size"] >= 2**20 else f"{row['size'] // 1024} KiB"
            print(f"| {label} | {row['path']} | {row['mib_s']:.0f} | {row['ratio']:.2f} | "
                  f"{row['latency_ms']:.2f} |", flush=True)
    print(f"elsewhere: up to {worst_share:.0%} of the machine during one size's rows (benchmarks/load.py)"
          + (" (loaded: the ratios are not results; re-run on a quiet machine)" if worst_share > QUIET_SHARE else ""))


if __name__ == "__main__":
    main()
