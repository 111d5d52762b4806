"""A D side of the one-sided Mooncake flow in its own process, for tests/splitwise/test_mooncake_transfer.py.

Usage: python -m tests.splitwise.mooncake_peer --prefill-addr HOST:PORT [--secret S] [--flip]
D registers its KV cache with its transfer engine, reserves request "r0" at P with the destination of its blocks,
waits for P's placed hand-off, optionally flips one byte of a placed block (--flip), verifies the hand-off over
its own blocks and prints a JSON summary: the verdict, its error, and a digest of positions 0..L−1 of its blocks.
"""
from __future__ import annotations

import argparse
import json

import blake3

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.splitwise import Deadline, Insert, MonotonicClock, receive_handoff
from fastdeploy.splitwise.mooncake import MooncakeKVTransfer
from fastdeploy.splitwise.zmq_transport import ZmqTransport
from fastdeploy.worker.kv_transfer import PromptKVPort
from tests.splitwise.mooncake_layout import BLOCK_SIZE, CONFIG_HASH, D_BLOCKS, LAYER_TAILS, NUM_BLOCKS, NUM_TOKENS


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefill-addr", required=True)
    parser.add_argument("--secret", default=None)
    parser.add_argument("--flip", action="store_true")
    args = parser.parse_args()
    port = PromptKVPort(KVCache(NUM_BLOCKS, BLOCK_SIZE, LAYER_TAILS), num_target_layers=2)
    transfer = MooncakeKVTransfer.start(port, "tcp")
    transport = ZmqTransport(secret=None if args.secret is None else args.secret.encode())
    try:
        transport.reserve("r0", args.prefill_addr, data=transfer.reservation_data(D_BLOCKS))
        envelope = transport.poll(Deadline.after(MonotonicClock(), 30.0))
        if envelope is None:
            print(json.dumps({"verdict": None, "error": "no hand-off"}), flush=True)
            return 1
        if args.flip:   # one byte of the last placed block changes after P wrote it, before D verifies
            chunk = port.prompt_kv_chunks(D_BLOCKS, NUM_TOKENS)[-1]
            chunk[len(chunk) // 2] ^= 0x10
        verdict = receive_handoff("r0", envelope.payload, config_hash=CONFIG_HASH, num_speculative_tokens=1,
                                  kv_layout=port.layout, key=transport.handoff_key,
                                  kv_in_place=transfer.in_place(D_BLOCKS))
        transport.ack("r0")
        digest = blake3.blake3()
        for chunk in port.prompt_kv_chunks(D_BLOCKS, NUM_TOKENS):
            digest.update(chunk)
        print(json.dumps({"verdict": type(verdict).__name__, "error": getattr(verdict, "error", None),
                          "inline": verdict.message.kv_inline if isinstance(verdict, Insert) else None,
                          "kv_digest": digest.hexdigest()}), flush=True)
        transport.poll(Deadline.after(MonotonicClock(), 0.2))   # let the ack leave before the sockets close
    finally:
        transport.close()
        transfer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
