"""A latency relay for the hosts harness (docs/testing.md, "Hosts"): this kernel has no `netem`, so a fixed one-way
delay between two hosts is added in userspace.

`Relay(host, peer, delay_s)` intercepts every TCP connection that `host` opens to `peer` (all ports, or `ports`)
and carries its bytes with `delay_s` added in each direction: an nftables `redirect` in `host`'s namespace (a table
of its own, `ip fdrelay`, so the harness's loss and partition rules are untouched) sends such a connection to the
relay's listener on `host`'s loopback; the relay reads where it was going (`SO_ORIGINAL_DST`), opens its own
connection there (marked with `SO_MARK`, which the redirect rule skips) and copies each chunk read from one side to
the other no earlier than `delay_s` after it was read. Faults still apply: the relay's own connection to the peer
is an ordinary packet flow, so a partition or loss rule between the hosts cuts or thins it.

A delay line that buffered without bound would hide the peer's flow control: each direction holds at most
`max_buffered` bytes (read no further until they are written), so a slow reader still pushes back on its sender.
The relay runs on one thread of the test process that entered `host`'s namespace; `close` stops it and closes every
socket (the nftables table goes with the namespace).
"""
from __future__ import annotations

import asyncio
import collections
import socket
import struct
import threading
import time

from tests.hosts.netns import Host, _enter, _run

_SO_ORIGINAL_DST = 80          # linux/netfilter_ipv4.h
_MARK = 0x4644                 # the relay's own connections: not redirected again
_CHUNK = 256 << 10
_START_TIMEOUT_S = 10.0


class Relay:
    """Delays the TCP connections `host` opens to `peer` by `delay_s` each way (see the module's docstring)."""

    def __init__(self, host: Host, peer: Host, delay_s: float, ports: tuple[int, ...] = (),
                 max_buffered: int = 8 << 20):
        if not 0 <= delay_s <= 1:
            raise ValueError(f"Relay: argument 'delay_s' must be within 0..1 s (got {delay_s})")
        self.host, self.peer, self.delay_s, self.ports, self.max_buffered = host, peer, delay_s, ports, max_buffered
        self.connections = 0             # connections relayed so far
        self.bytes_relayed = 0           # both directions
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"relay-{host.name}", daemon=True)
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_S) or self._error is not None:
            self.close()
            raise RuntimeError(f"Relay on {host.name}: could not start: {self._error}")
        port = self._server.sockets[0].getsockname()[1]
        dports = f"tcp dport {{ {', '.join(map(str, ports))} }} " if ports else "meta l4proto tcp "
        _nft(host, "table ip fdrelay {\n"
                   "  chain out { type nat hook output priority -100; policy accept;\n"
                   f"    ip daddr {peer.address} meta mark != {_MARK} {dports}redirect to :{port}\n"
                   "  }\n}\n")

    def __enter__(self) -> "Relay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop intercepting, close every relayed connection and stop the thread."""
        _nft(self.host, "table ip fdrelay\ndelete table ip fdrelay\n", check=False)
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop)
        self._thread.join(_START_TIMEOUT_S)

    # ---- the relay's thread ----

    def _run(self) -> None:
        try:
            _enter(self.host.namespace)
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, "127.0.0.1", 0, limit=_CHUNK))
        except BaseException as error:   # noqa: BLE001 - reported to the constructor
            self._error = error
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _stop(self) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        self._loop.call_later(0.05, self._loop.stop)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        upstream = None
        try:
            original = writer.get_extra_info("socket").getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
            port, address = struct.unpack("!2xH4s8x", original)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, _MARK)
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, (socket.inet_ntoa(address), port))
            except OSError:
                sock.close()
                raise
            up_reader, upstream = await asyncio.open_connection(sock=sock, limit=_CHUNK)
            self.connections += 1
            await asyncio.gather(self._pipe(reader, upstream), self._pipe(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for each in (writer, upstream):
                if each is not None:
                    each.close()
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copies `reader` to `writer`, each chunk written no earlier than `delay_s` after it was read; at most
        `max_buffered` bytes in between. The end of the stream is passed on after its delay too."""
        line: collections.deque[tuple[float, bytes]] = collections.deque()
        state = {"buffered": 0, "done": False}
        room, queued = asyncio.Event(), asyncio.Event()
        room.set()

        async def read() -> None:
            try:
                while True:
                    await room.wait()
                    chunk = await reader.read(_CHUNK)
                    line.append((time.monotonic() + self.delay_s, chunk))
                    queued.set()
                    if not chunk:
                        return
                    state["buffered"] += len(chunk)
                    if state["buffered"] >= self.max_buffered:
                        room.clear()
            except OSError:
                line.append((time.monotonic(), b""))
                queued.set()

        async def write() -> None:
            while True:
                while not line:
                    queued.clear()
                    await queued.wait()
                due, chunk = line.popleft()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                self.bytes_relayed += len(chunk)   # before the write: a peer never holds bytes not yet counted
                writer.write(chunk)
                await writer.drain()
                state["buffered"] -= len(chunk)
                if state["buffered"] < self.max_buffered:
                    room.set()

        reading = asyncio.ensure_future(read())
        try:
            await write()
        finally:
            reading.cancel()


def _nft(host: Host, script: str, check: bool = True) -> None:
    _run("ip", "netns", "exec", host.namespace, "nft", "-f", "-", input=script, check=check)
