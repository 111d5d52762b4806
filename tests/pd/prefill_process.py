"""A prefill instance P (fd-toy) in its own process, over the ZeroMQ connector, for the two-process PD test.

Usage: python -m tests.pd.prefill_process K REQUESTS_JSON. Prints {"address": ...} once listening, serves the
requests (each waits for D's reservation), and after every hand-off is acknowledged prints P's resource stats.
"""
from __future__ import annotations

import json
import sys
import time

from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.entrypoints.pd_builder import build_engine, with_role
from fastdeploy.model_executor.models import get_model
from fastdeploy.splitwise.zmq_transport import ZmqTransport
from tests.pd.harness import toy_config

GIVE_UP_S = 60.0


def main() -> int:
    k, requests = int(sys.argv[1]), json.loads(sys.argv[2])
    transport = ZmqTransport(listen="127.0.0.1:0")
    try:
        prefill = build_engine(with_role(toy_config(k), "prefill"), get_model("fd-toy"), transport)
        print(json.dumps({"address": transport.address}), flush=True)
        for r in requests:
            prefill.add_request(r["request_id"], r["prompt"], SamplingParams(**r["params"]),
                                tuple(tuple(s) for s in r["stop_seqs"]), disaggregate_info=r["disaggregate_info"])
        reported, give_up = {}, time.monotonic() + GIVE_UP_S
        while prefill.has_unfinished() and time.monotonic() < give_up:
            for request in prefill.step():
                reported[request.request_id] = [request.finish_reason, request.error]
        stats = prefill.stats()
        print(json.dumps({"reported": reported, "free_slots": stats.free_slots, "total_slots": stats.total_slots,
                          "free_kv_blocks": stats.free_kv_blocks, "total_kv_blocks": stats.total_kv_blocks,
                          "unfinished": prefill.has_unfinished()}), flush=True)
    finally:
        transport.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
