"""A flooding peer for the connector's volume tests (docs/design.md §8, "Floods"), run as its own process so that
the flood competes with the connector's I/O thread as a remote peer would (not under the test's GIL).

  python -m tests.splitwise.flooder junk ADDR           # a D that sends one-byte frames to P's port, nonstop
  python -m tests.splitwise.flooder fake-p junk          # a P (address on stdout) that floods each D that reserves
  python -m tests.splitwise.flooder fake-p big BYTES     # a P that accepts, answers with a BYTES-byte frame, and
                                                         # prints "disconnected" once D drops the connection
  python -m tests.splitwise.flooder reserve ADDR N BYTES # a D that sends N reservations carrying BYTES of data
  python -m tests.splitwise.flooder big ADDR BYTES       # a D that sends one BYTES-byte frame to P's port, and
                                                         # prints "disconnected" once P drops the connection

It runs until killed (the test kills it), except `reserve`, which prints "done" once its N messages are queued.
With FD_PD_SECRET set its sockets hold that secret's transport keys (a flooding peer past the handshake; a stranger
delivers nothing, test_strangers.py); its messages are still tagged without the key.
"""
from __future__ import annotations

import json
import mmap
import os
import secrets
import sys

import zmq
from zmq.utils.monitor import recv_monitor_message

from fastdeploy.splitwise.peer_message import ACCEPT, HANDOFF, RESERVE, header_frame
from fastdeploy.splitwise.secret import MessageTagger
from tests.splitwise.rogue import holding_secret


def _socket(kind: int) -> zmq.Socket:
    secret = os.environ.get("FD_PD_SECRET", "").encode() or None
    return holding_secret(zmq.Context.instance().socket(kind), secret, server=kind == zmq.ROUTER)


def _untouched(nbytes: int) -> memoryview:
    """`nbytes` zero bytes that cost no memory: a private anonymous mapping reads as the kernel's zero page. (A
    bytearray is zeroed by CPython, a shared mapping, mmap's default, allocates every page read: either made each
    big flooder 1 GiB resident, 2 GiB for the battery's two.)"""
    return memoryview(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))


def _junk(addr: str) -> None:
    socket = _socket(zmq.DEALER)
    socket.setsockopt(zmq.SNDHWM, 100_000)
    socket.connect(f"tcp://{addr}")
    while True:
        try:
            socket.send(b"x", zmq.NOBLOCK)
        except zmq.Again:
            socket.poll(1, zmq.POLLOUT)


def _fake_p(mode: str, nbytes: int) -> None:
    router = _socket(zmq.ROUTER)
    router.setsockopt(zmq.SNDHWM, 100_000)
    router.bind("tcp://127.0.0.1:0")
    print(router.getsockopt(zmq.LAST_ENDPOINT).decode().removeprefix("tcp://"), flush=True)
    tagger = MessageTagger(None)
    while True:
        identity, head, *_ = router.recv_multipart()
        fields = json.loads(head)
        if fields.get("kind") != RESERVE:
            continue
        rid, nonce = fields["request_id"], fields["nonce"]
        router.send_multipart([identity, header_frame(tagger, ACCEPT, rid, nonce, [])])
        if mode == "big":   # then say whether D dropped the connection (libzmq's monitor), and stop
            monitor = router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            body = [_untouched(nbytes)]   # sent without a copy
            router.send_multipart([identity, header_frame(tagger, HANDOFF, rid, nonce, [b""]), *body], copy=False)
            recv_monitor_message(monitor)
            print("disconnected", flush=True)
            sys.stdin.read()
            return
        while True:   # junk to that D until killed
            try:
                router.send_multipart([identity, b"x"], zmq.NOBLOCK)
            except zmq.Again:
                router.poll(1, zmq.POLLOUT)


def _big(addr: str, nbytes: int) -> None:
    socket = _socket(zmq.DEALER)
    monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    socket.connect(f"tcp://{addr}")
    socket.send(_untouched(nbytes), copy=False)
    recv_monitor_message(monitor)
    print("disconnected", flush=True)
    sys.stdin.read()


def _reserve(addr: str, count: int, nbytes: int) -> None:
    socket = _socket(zmq.DEALER)
    socket.setsockopt(zmq.SNDHWM, count + 1)
    socket.connect(f"tcp://{addr}")
    tagger = MessageTagger(None)
    data = json.dumps({"x": "0" * max(0, nbytes - 9)}).encode()
    for i in range(count):
        body = [data] if nbytes else []
        socket.send_multipart([header_frame(tagger, RESERVE, f"flood-{i}", secrets.token_hex(16), body), *body])
    print("done", flush=True)
    sys.stdin.read()   # keep the connection until the test closes our stdin or kills us


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "junk":
        _junk(sys.argv[2])
    elif what == "fake-p":
        _fake_p(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    elif what == "big":
        _big(sys.argv[2], int(sys.argv[3]))
    elif what == "reserve":
        _reserve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown mode {what!r}")
