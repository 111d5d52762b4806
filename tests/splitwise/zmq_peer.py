"""A P side of the ZeroMQ connector in its own process, for the cross-process connector tests.

Usage: python -m tests.splitwise.zmq_peer [--secret S] [--expect-acks N] [--expect-refused N] [--timeout-s T]
Prints {"address": "host:port"} once bound, answers every reservation "r<i>" with make_message(seed=i), and exits
after N acks and N refused messages (or the timeout), printing a JSON summary of what it saw.
"""
from __future__ import annotations

import argparse
import json

from fastdeploy.splitwise import Deadline, MonotonicClock
from fastdeploy.splitwise.zmq_transport import REFUSE_REASONS, ZmqTransport
from tests.splitwise.handoff_factory import make_message
from tests.splitwise.fakes import reservation_ids


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--secret", default=None)
    parser.add_argument("--expect-acks", type=int, default=0)
    parser.add_argument("--expect-refused", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=20.0)
    args = parser.parse_args()
    clock = MonotonicClock()
    transport = ZmqTransport(listen="127.0.0.1:0", secret=None if args.secret is None else args.secret.encode())
    print(json.dumps({"address": transport.address}), flush=True)
    give_up, acks, reservations = Deadline.after(clock, args.timeout_s), [], []
    try:
        while (len(acks) < args.expect_acks or transport.num_refused() < args.expect_refused) \
                and not give_up.is_expired():
            rid = reservation_ids(transport)(Deadline.after(clock, 0.02))
            if rid is not None:
                reservations.append(rid)
                transport.send(rid, make_message(seed=int(rid[1:]), request_id=rid).encode_frames())
            while (ack := transport.poll_ack()) is not None:
                acks.append(ack)
        print(json.dumps({"reservations": reservations, "acks": acks, "kv_bytes_sent": transport.kv_bytes_sent,
                          "refused": {r: transport.num_refused(r) for r in REFUSE_REASONS}}), flush=True)
    finally:
        transport.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
