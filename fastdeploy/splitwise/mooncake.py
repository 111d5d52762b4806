"""One-sided KV transfer through the Mooncake transfer engine: P writes a request's prompt KV straight into D's blocks.

The flow (SERVICES §7, docs/design.md §8): each instance registers its KV cache memory with its engine once at start
(`MooncakeKVTransfer.start`). D's reservation carries `reservation_data(block_ids)`: D's transfer session address
and where each of its reserved blocks lives in every layer. P writes positions 0..L−1 of every layer from its own
blocks into D's (`write_to`: the writes all started at once, a run of blocks consecutive on both sides being one write,
overlapped with hashing the same bytes), seals a placed hand-off over the same source bytes
(`HandoffMessage.create_placed`) and sends only that header over the ZeroMQ connector; D verifies the tag over its
own blocks in place (`in_place`, the receipt's `kv_in_place`) before the request is inserted. P's side has a
staging pool (`StagingPool`): P copies the ranges into one of its slots and writes from there, so its KV blocks go
back once the copy is done, not when the engine lets go of the write (a P↔D partition can stall it for minutes).

`mooncake-transfer-engine-non-cuda` (the `[mooncake]` extra) moves host memory; its metadata is exchanged
peer-to-peer (`P2PHANDSHAKE`, no etcd). Protocol "tcp" runs anywhere; "rdma" is the same code with an RDMA device
name (`--mooncake-device`) and needs an RDMA NIC.
"""
from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fastdeploy.schema.pairing import address_error
from fastdeploy.splitwise.handoff import PlacedKV

logger = logging.getLogger(__name__)

PROTOCOLS = ("tcp", "rdma")
WAIT_TIMEOUT_S = 60.0    # the longest a write batch may take by default (P's KV_TRANSFER deadline's default)
RDMA_DEVICES = "/sys/class/infiniband"   # where Linux lists RDMA devices
STAGING_SLOTS = 4        # P's writes that may be in flight from staging at once (each slot: one longest hand-off)
_INSTALL_HINT = ('pip install -e ".[mooncake]" (mooncake-transfer-engine-non-cuda; its library needs the Debian '
                 "packages libibverbs1 and libnuma1)")


class MooncakeError(RuntimeError):
    """The transfer engine is missing, could not start, or a transfer failed; the message is one line."""


class WritesStillRunning(MooncakeError):
    """A write batch did not land within its timeout and the transfer engine has not given it up: it may still be
    reading the source memory. `ended` is set once the engine has let go of every write; until then the source must stay
    as it is (P keeps the blocks held, or the staging slot stays taken when `staged`)."""

    def __init__(self, message: str, ended: threading.Event):
        super().__init__(message)
        self.ended = ended
        self.staged = False   # written from a staging slot: P's blocks are not the source (the slot waits instead)


def _transfer_engine_class():
    # The engine logs every connection at INFO; keep its log to warnings unless the user chose a level.
    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
    try:
        from mooncake.engine import TransferEngine
    except ImportError as error:
        raise MooncakeError(f"Mooncake transfer engine unavailable ({error}); install it with {_INSTALL_HINT}") \
            from None
    return TransferEngine


def rdma_devices() -> list[str]:
    """The RDMA devices of this machine (empty without an RDMA NIC)."""
    try:
        return sorted(os.listdir(RDMA_DEVICES))
    except OSError:
        return []


def mooncake_unavailable_reason() -> str | None:
    """Why the transfer engine cannot be loaded here, or None when it can (for tests that skip)."""
    try:
        _transfer_engine_class()
    except MooncakeError as error:
        return str(error)
    return None


_NOT_STARTED = (0, 2**64 - 1)   # transfer_submit_write's "could not start" (0; -1 as unsigned in older wheels)
_POLL_S = (0.0002, 0.005)       # the watch's first and longest pause between looks: a write's end is seen within 5 ms


class _WriteWatch:
    """Looks at single-write batches until each has ended (landed or failed), pausing between looks, on a
    thread of its own: `ended` is set once the engine has let go of all of them; `failures` names those that
    failed (the binding's codes: -1 failed, -2 timed out), or the error that stopped the looking."""

    def __init__(self, engine, writes: Sequence[int]):
        self._engine, self._running = engine, list(writes)
        self.failures: list[str] = []
        self.changed = threading.Condition()
        self.ended = threading.Event()
        threading.Thread(target=self._run, name="mooncake-wait", daemon=True).start()

    def _run(self) -> None:
        pause = _POLL_S[0]
        try:
            while self._running:
                codes = [self._engine.transfer_check_status(write) for write in self._running]
                failed = [f"code {code}" for code in codes if code not in (0, 1)]
                self._running = [write for write, code in zip(self._running, codes) if code == 0]
                if failed:
                    with self.changed:
                        self.failures += failed
                        self.changed.notify_all()
                if self._running:
                    time.sleep(pause)
                    pause = min(2 * pause, _POLL_S[1])
        except Exception as error:   # noqa: BLE001 - reported by the waiter, not lost on this thread
            with self.changed:
                self.failures.append(f"waiting failed: {error}")
        finally:
            with self.changed:
                self.ended.set()
                self.changed.notify_all()


class MooncakeEngine:
    """A started Mooncake `TransferEngine`: registered host memory and batched one-sided writes to a peer."""

    def __init__(self, protocol: str = "tcp", device: str = "", hostname: str = "127.0.0.1"):
        if protocol not in PROTOCOLS:
            raise ValueError(f"MooncakeEngine: argument 'protocol' must be one of {list(PROTOCOLS)} (got {protocol!r})")
        if protocol == "rdma" and not device:
            raise ValueError("MooncakeEngine: argument 'device' (--mooncake-device) is required with protocol 'rdma'")
        # The engine starts without complaint on a device that does not exist or a host name nobody can reach,
        # and only the first transfer fails: check both here, so the instance refuses to start instead.
        if protocol == "rdma" and device not in rdma_devices():
            raise MooncakeError(f"Mooncake transfer engine did not start: RDMA device {device!r} not found "
                                f"({RDMA_DEVICES} lists {rdma_devices() or 'no RDMA device'})")
        try:
            socket.getaddrinfo(hostname, None)
        except (OSError, UnicodeError) as error:
            raise MooncakeError(f"Mooncake transfer engine did not start: host {hostname!r} does not resolve "
                                f"({error})") from None
        self._engine = _transfer_engine_class()()
        code = self._engine.initialize(hostname, "P2PHANDSHAKE", protocol, device)
        if code != 0:
            raise MooncakeError(f"Mooncake transfer engine did not start: protocol {protocol!r}, device "
                                f"{device or '(none)'!r}, host {hostname!r} (initialize returned {code})")
        self.protocol = protocol
        self.session_address = f"{hostname}:{self._engine.get_rpc_port()}"
        self._registered: list[int] = []

    def register(self, regions: Sequence[tuple[int, int]]) -> None:
        """Register host memory regions (address, bytes) once; peers may then write into them (and this side may
        write from them)."""
        addresses, lengths = [int(a) for a, _ in regions], [int(n) for _, n in regions]
        code = self._engine.batch_register_memory(addresses, lengths)
        if code != 0:
            raise MooncakeError(f"Mooncake transfer engine: registering {len(regions)} regions of "
                                f"{sum(lengths)} bytes failed (code {code})")
        self._registered.extend(addresses)

    def submit_write(self, session: str, sources: Sequence[int], destinations: Sequence[int],
                     lengths: Sequence[int]) -> tuple[int, ...]:
        """Start writing local (source address, length) ranges to the peer's registered destination addresses,
        without waiting; returns the writes to `wait` for. Each range is its own batch of one write: the binding's
        only look at a batch that does not block (`transfer_check_status`) reads its first write, and its wait for
        a whole batch spins a core until the batch ends (a partition's minutes included). If a write cannot start,
        WritesStillRunning for the ones already started (they may still read the sources)."""
        started: list[int] = []
        for source, destination, length in zip(sources, destinations, lengths):
            write = self._engine.transfer_submit_write(session, int(source), int(destination), int(length))
            if write in _NOT_STARTED:
                message = (f"Mooncake transfer engine: writing {len(lengths)} ranges to {session} could not start "
                           "(peer unreachable or addresses not registered there)")
                if not started:
                    raise MooncakeError(message)
                raise WritesStillRunning(message, _WriteWatch(self._engine, started).ended)
            started.append(write)
        return tuple(started)

    def wait(self, session: str, *writes: tuple[int, ...], timeout_s: float = WAIT_TIMEOUT_S) -> None:
        """Until every write of `writes` landed; MooncakeError if one failed, WritesStillRunning if they did not
        all land within `timeout_s` or one failed while others still run (the engine has no bound of its own on
        a write: a helper thread watches them, left to end by itself; the error says when it has)."""
        started = [write for batch in writes for write in batch]
        if not started:
            return
        watch = _WriteWatch(self._engine, started)
        with watch.changed:
            watch.changed.wait_for(lambda: watch.ended.is_set() or watch.failures, timeout_s)
            failures = list(watch.failures)
        if not watch.ended.is_set():
            reason = f"a write failed ({failures[0]}) while others still run" if failures else \
                f"the writes did not land within {timeout_s:g} s"
            raise WritesStillRunning(f"Mooncake transfer engine: writing to {session}: {reason}", watch.ended)
        if failures:
            raise MooncakeError(f"Mooncake transfer engine: a write to {session} failed ({failures[0]}: the peer "
                                "went away, or an address is outside its registered memory)")

    def close(self) -> None:
        for address in self._registered:
            self._engine.unregister_memory(address)
        self._registered.clear()


class BlockPort(Protocol):
    """The KV cache as the one-sided flow sees it (worker/kv_transfer.py `PromptKVPort`)."""

    @property
    def block_size(self) -> int: ...

    def memory_regions(self) -> list[tuple[int, int]]: ...

    def block_regions(self) -> list[tuple[int, int]]: ...

    def prompt_kv_ranges(self, block_ids: Sequence[int], num_tokens: int) -> list[tuple[int, int]]: ...

    def placed_kv(self, num_tokens: int) -> PlacedKV: ...

    def prompt_kv_chunks(self, block_ids: Sequence[int], num_tokens: int) -> list[memoryview]: ...


@dataclass(frozen=True, slots=True)
class Destination:
    """Where D wants a request's KV: block `block_ids[j]` of layer l starts at `layers[l][0] + block_ids[j] *
    layers[l][1]` in the memory D registered with the engine at `session`."""

    session: str
    block_ids: tuple[int, ...]
    layers: tuple[tuple[int, int], ...]  # (address of block 0, bytes per block), one per layer

    @classmethod
    def parse(cls, data: object) -> Destination:
        """From a reservation's data (`MooncakeKVTransfer.reservation_data`); ValueError naming the field."""
        entry = data.get("mooncake") if isinstance(data, dict) else None
        if not isinstance(entry, dict) or set(entry) != {"session", "block_ids", "layers"}:
            raise ValueError("reservation data: field 'mooncake' must be {'session', 'block_ids', 'layers'} "
                             "(D is not on a Mooncake transport?)")
        session = entry["session"]
        if address_error(session) is not None:
            raise ValueError(f"reservation data: field 'mooncake.session' must be 'host:port' (got {session!r})")
        ids, layers = entry["block_ids"], entry["layers"]
        if not isinstance(ids, list) or not ids or not all(_is_index(b) for b in ids):
            raise ValueError("reservation data: field 'mooncake.block_ids' must be a non-empty list of ints >= 0")
        if not isinstance(layers, list) or not layers or not all(
                isinstance(pair, list) and len(pair) == 2 and all(_is_index(v) for v in pair) for pair in layers):
            raise ValueError("reservation data: field 'mooncake.layers' must be a list of [address, block bytes]")
        return cls(session, tuple(ids), tuple((a, n) for a, n in layers))


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class StagingPool:
    """Fixed-size slots of host memory that P registers with its transfer engine once at start, copies a
    hand-off's KV ranges into and writes from, so that its KV blocks go back as soon as the copy is done. A slot
    is taken per write and given back when the engine lets go of the write: at once when it landed or failed, and
    for one that did not land within its timeout once the engine lets go of it (`WritesStillRunning.ended`;
    until then the engine may still read the slot). When no slot is free, or a hand-off is larger than a slot,
    `take` returns None and P writes from its blocks in place, holding them until the engine lets go (docs/design.md
    §8): waiting for a slot would fail healthy D's hand-offs behind writes a partition stalls."""

    def __init__(self, slots: int, slot_bytes: int):
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"StagingPool: arguments 'slots' and 'slot_bytes' must be >= 1 (got {slots}, "
                             f"{slot_bytes})")
        self.slots, self.slot_bytes = slots, slot_bytes
        self._memory = np.empty(slots * slot_bytes, dtype=np.uint8)   # pages resident as they are first written
        self._free = list(range(slots))
        self._pending: dict[int, threading.Event] = {}   # slots of writes the engine still runs -> set once it let go
        self._lock = threading.Lock()                    # taken on the placing thread, counted on the engine's
        self.in_place_writes = 0                          # writes the pool could not take

    @classmethod
    def sized_for(cls, port: BlockPort, max_tokens: int, slots: int = STAGING_SLOTS) -> StagingPool:
        """`slots` slots of the longest hand-off's bytes: `max_tokens` positions (whole blocks) of every layer."""
        blocks = -(-max_tokens // port.block_size)
        return cls(slots, blocks * sum(block_bytes for _, block_bytes in port.block_regions()))

    def region(self) -> tuple[int, int]:
        """(address, bytes) of the whole pool: what the engine registers."""
        return self._memory.ctypes.data, self._memory.nbytes

    def take(self, nbytes: int) -> int | None:
        """A free slot for `nbytes`, or None (full, or larger than a slot: the caller writes in place)."""
        with self._lock:
            self._reclaim()
            if nbytes > self.slot_bytes or not self._free:
                self.in_place_writes += 1
                return None
            return self._free.pop()   # the slot freed last: while writes land, one slot's pages stay resident

    def view(self, slot: int) -> np.ndarray:
        return self._memory[slot * self.slot_bytes:(slot + 1) * self.slot_bytes]

    def release(self, slot: int, ended: threading.Event | None = None) -> None:
        """The write from `slot` is over; or, with `ended`, over once that event is set (the engine let go)."""
        with self._lock:
            if ended is None or ended.is_set():
                self._free.append(slot)
            else:
                self._pending[slot] = ended

    def in_use(self) -> int:
        """Slots taken by writes the engine has not let go of."""
        with self._lock:
            self._reclaim()
            return self.slots - len(self._free)

    def _reclaim(self) -> None:
        for slot in [slot for slot, ended in self._pending.items() if ended.is_set()]:
            del self._pending[slot]
            self._free.append(slot)


class MooncakeKVTransfer:
    """One instance's side of the one-sided KV flow: its engine with its KV cache memory registered."""

    def __init__(self, port: BlockPort, engine: MooncakeEngine, staging: StagingPool | None = None):
        self.port, self.engine, self.staging = port, engine, staging
        engine.register(port.memory_regions() + ([staging.region()] if staging is not None else []))

    @classmethod
    def start(cls, port: BlockPort, protocol: str = "tcp", device: str = "", hostname: str = "127.0.0.1",
              staging_tokens: int = 0, staging_slots: int | None = None) -> MooncakeKVTransfer:
        """With `staging_tokens` (P: its longest prompt), a staging pool of `staging_slots` slots (None:
        STAGING_SLOTS; 0: none) sized for it (`StagingPool.sized_for`)."""
        slots = STAGING_SLOTS if staging_slots is None else staging_slots
        staging = StagingPool.sized_for(port, staging_tokens, slots) if staging_tokens > 0 and slots > 0 else None
        if staging is not None:
            logger.info("Mooncake: staging pool of %d slots x %.1f MiB (a hand-off of %d positions each)",
                        staging.slots, staging.slot_bytes / 2**20, staging_tokens)
        return cls(port, MooncakeEngine(protocol, device, hostname), staging)

    def close(self) -> None:
        self.engine.close()

    # ---- D ----

    def reservation_data(self, block_ids: Sequence[int]) -> dict:
        """What D's reservation carries so P can write the request's KV into `block_ids` (JSON)."""
        return {"mooncake": {"session": self.engine.session_address, "block_ids": [int(b) for b in block_ids],
                             "layers": [[a, n] for a, n in self.port.block_regions()]}}

    def in_place(self, block_ids: Sequence[int]):
        """The receipt's `kv_in_place` for a request placed in `block_ids`: D's own bytes, read where they are."""
        ids = list(block_ids)
        return lambda num_tokens: self.port.prompt_kv_chunks(ids, num_tokens)

    # ---- P ----

    def write_to(self, destination: Destination, block_ids: Sequence[int], num_tokens: int,
                 timeout_s: float = WAIT_TIMEOUT_S,
                 on_copied: Callable[[], None] | None = None) -> Iterator[memoryview]:
        """Write positions 0..L−1 of every layer from P's `block_ids` into D's blocks, and yield the bytes written
        in the tag's order: all writes are started first, so hashing what is yielded overlaps the
        transfer. With a staging pool the ranges are first copied into a slot and written from there, and
        `on_copied()` is called once the copy is done (P's blocks may go back then); when the pool takes no more,
        the writes read P's blocks in place and `on_copied` is not called. Once exhausted every write has landed;
        MooncakeError if one failed or they did not land within `timeout_s`."""
        self._check(destination, self.port.block_regions(), num_tokens)
        chunks = self.port.prompt_kv_chunks(block_ids, num_tokens)   # validates P's block ids
        sources = self.port.prompt_kv_ranges(block_ids, num_tokens)
        blocks = -(-num_tokens // self.port.block_size)
        targets = [base + destination.block_ids[j] * block_bytes
                   for base, block_bytes in destination.layers for j in range(blocks)]
        slot = None if self.staging is None else self.staging.take(sum(n for _, n in sources))
        if slot is not None:
            chunks, sources = self._stage(slot, chunks, sources, len(destination.layers))
            if on_copied is not None:
                on_copied()
        elif self.staging is not None:
            logger.info("Mooncake: every staging slot is in use; writing from P's blocks in place (held until the "
                        "write is over)")
        writes = runs([(src, dst, n) for (src, n), dst in zip(sources, targets)])
        try:
            batch = self.engine.submit_write(destination.session, *map(list, zip(*writes)))
        except WritesStillRunning as error:   # some writes started: the engine may still read their source
            error.staged = slot is not None
            if slot is not None:
                self.staging.release(slot, error.ended)
            raise
        except BaseException:
            if slot is not None:
                self.staging.release(slot)
            raise
        ended = None
        try:
            yield from chunks
        finally:
            try:
                self.engine.wait(destination.session, batch, timeout_s=timeout_s)
            except WritesStillRunning as error:
                ended, error.staged = error.ended, slot is not None   # the engine may still read the slot
                raise
            finally:
                if slot is not None:
                    self.staging.release(slot, ended)

    def _stage(self, slot: int, chunks: list[memoryview], sources: list[tuple[int, int]],
               layers: int) -> tuple[list[memoryview], list[tuple[int, int]]]:
        """Copy `chunks` (P's bytes, in the tag's order) into `slot`, back to back; the slot's bytes one view per
        layer, and the ranges of `sources` where they now lie in the slot (the same order and lengths)."""
        view, base = self.staging.view(slot), self.staging.region()[0] + slot * self.staging.slot_bytes
        offset = 0
        for chunk in chunks:
            view[offset:offset + chunk.nbytes] = np.frombuffer(chunk, dtype=np.uint8)
            offset += chunk.nbytes
        starts = list(itertools.accumulate((n for _, n in sources), initial=0))
        per_layer = len(sources) // layers
        staged = [memoryview(view[starts[layer * per_layer]:starts[(layer + 1) * per_layer]])
                  for layer in range(layers)]
        return staged, [(base + start, n) for start, (_, n) in zip(starts, sources)]

    def staged_writes(self) -> int:
        """Writes in flight from the staging pool (0 without one)."""
        return 0 if self.staging is None else self.staging.in_use()

    def _check(self, destination: Destination, regions: list[tuple[int, int]], num_tokens: int) -> None:
        if len(destination.layers) != len(regions):
            raise ValueError(f"reservation data: D's cache has {len(destination.layers)} layers, P's {len(regions)}")
        for layer, ((_, mine), (_, theirs)) in enumerate(zip(regions, destination.layers)):
            if mine != theirs:
                raise ValueError(f"reservation data: layer {layer} blocks are {theirs} bytes on D, {mine} on P")
        needed = -(-num_tokens // self.port.block_size)
        if len(destination.block_ids) < needed:
            raise ValueError(f"reservation data: D reserved {len(destination.block_ids)} blocks, {num_tokens} "
                             f"positions need {needed}")


def runs(writes: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(source, destination, length) writes with each one that continues the previous on both sides merged into
    it: consecutive blocks on P and on D move as one write (the transfer engine's cost is per write, not per
    byte, at block sizes)."""
    merged: list[list[int]] = []
    for source, target, length in writes:
        last = merged[-1] if merged else None
        if last is not None and last[0] + last[2] == source and last[1] + last[2] == target:
            last[2] += length
        else:
            merged.append([source, target, length])
    return [(s, t, n) for s, t, n in merged]
