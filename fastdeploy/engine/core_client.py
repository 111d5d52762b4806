"""Starts and supervises an engine core process and talks to it from the API server's asyncio loop.

The client binds two ZeroMQ `ipc://` sockets (requests out, outputs in), starts the engine core as a child
process and routes each `RequestDelta` to the coroutine waiting on that request. The core is declared dead when
its process exits, when it reports `CoreFailed`, when no message arrives for `heartbeat_timeout_s` (its heartbeat
comes from a thread of its own whatever the step loop does, engine/pulse.py: silence means the whole process is
wedged, and it is killed), or, only when `step_timeout_s` is set, when one step-loop turn has run longer than that.
A long step with the heartbeat going on is busy, not dead: it is logged, once per heartbeat timeout it lasts. Then
every in-flight request ends with `EngineDeadError`, `is_ready` stays False and `on_dead` is told (the API server
then exits non-zero so that a supervisor restarts the instance).

The core gets the API server's flags as JSON on its stdin, not on its command line (which every local user can
read), and without the flags it has no use for (`SECRET_FLAGS`); the environment variables that hold the API
server's own secrets are not passed on either.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from fastdeploy.schema.core_protocol import (AbortRequest, AddRequest, CoreFailed, Heartbeat, Ready, RequestDelta,
                                             ResetPrefixCache, Shutdown, StepOutputs, decode_message, encode_message,
                                             salvage_step_outputs)

logger = logging.getLogger("fastdeploy.core_client")

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
# The engine core never authenticates clients nor registers with a router: these stay in the API server.
SECRET_FLAGS = ("api_key",)
SECRET_ENV = ("FD_API_KEY", "FD_ROUTER_SECRET")


class EngineDeadError(RuntimeError):
    """The engine core is gone (or not ready); the request cannot complete."""


class EngineCoreClient:
    """`state` is "starting", "ready", "dead" or "stopped"; `stats` is the engine's latest EngineStats (its load,
    e.g. for registering with a router). `on_outputs` sees every StepOutputs and `on_submit` every AddRequest sent
    (metrics); `on_dead` is called once with the reason when the core dies (not when it is shut down)."""

    def __init__(self, builder: str, args: dict, ready_timeout_s: float = 300.0, heartbeat_timeout_s: float = 30.0,
                 step_timeout_s: float | None = None, on_outputs: Callable[[StepOutputs], None] | None = None,
                 on_submit: Callable[[AddRequest], None] | None = None,
                 on_dead: Callable[[str], None] | None = None):
        self.builder = builder
        self.args = {name: value for name, value in args.items() if name not in SECRET_FLAGS}
        self.ready_timeout_s = ready_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.step_timeout_s = step_timeout_s
        self.on_outputs = on_outputs
        self.on_submit = on_submit
        self.on_dead = on_dead
        self.state = "starting"
        self.dead_reason: str | None = None
        self.process: subprocess.Popen | None = None
        self.stats = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._tasks: list[asyncio.Task] = []
        self._last_message = time.monotonic()
        self._beat = Heartbeat(turns=0, busy_s=0.0)   # the core's latest heartbeat ...
        self._beat_at = time.monotonic()               # ... and when it arrived
        self._busy_warned = (0, 0.0)                   # (turn, seconds into it) of the latest "busy" warning
        self._ready = asyncio.Event()
        self._gone = asyncio.Event()   # set once the core is dead or stopped
        self.ready_info: dict = {}     # the engine core's Ready.info (PD instances: connector address, hash)
        self._reset_answers: dict[int, asyncio.Future] = {}   # ResetPrefixCache id -> its answer
        self._reset_ids = itertools.count()

    @property
    def is_ready(self) -> bool:
        return self.state == "ready"

    async def start(self) -> None:
        """Bind the sockets and start the process; readiness is reported later (`wait_ready`, `is_ready`)."""
        self._dir = tempfile.mkdtemp(prefix="fd-core-")
        self._context = zmq.asyncio.Context()
        self._push = self._context.socket(zmq.PUSH)
        self._pull = self._context.socket(zmq.PULL)
        self._push.setsockopt(zmq.LINGER, 0)
        self._pull.setsockopt(zmq.LINGER, 0)
        input_addr, output_addr = f"ipc://{self._dir}/input", f"ipc://{self._dir}/output"
        monitors = [sock.get_monitor_socket(zmq.EVENT_ACCEPTED) for sock in (self._push, self._pull)]
        self._push.bind(input_addr)
        self._pull.bind(output_addr)
        env = {name: value for name, value in os.environ.items() if name not in SECRET_ENV}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
        command = [sys.executable, "-m", "fastdeploy.engine.engine_core", "--builder", self.builder,
                   "--input", input_addr, "--output", output_addr, "--parent-pid", str(os.getpid())]
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE)
        self._started = time.monotonic()
        logger.info("engine core started (pid %d)", self.process.pid)
        try:   # a few KiB: the pipe takes it whole, so this never blocks the event loop
            self.process.stdin.write(json.dumps(self.args).encode())
            self.process.stdin.close()
        except BrokenPipeError:   # the core died at once; the watch loop reports its exit status
            pass
        self._tasks = [asyncio.create_task(self._receive_loop()), asyncio.create_task(self._watch_loop()),
                       asyncio.create_task(self._unlink_once_connected(monitors))]

    async def wait_ready(self) -> bool:
        await self._ready.wait()
        return self.is_ready

    async def generate(self, message: AddRequest) -> AsyncIterator[RequestDelta]:
        """Send one request and yield its deltas up to the finished one. Raises EngineDeadError if the core is
        not ready or dies meanwhile. Closing the iterator early (client gone, task cancelled) aborts the request."""
        if not self.is_ready:
            raise EngineDeadError(self.dead_reason or f"the engine core is {self.state}")
        rid = message.request_id
        if rid in self._queues:
            raise ValueError(f"request {rid}: 'request_id' is already in use")
        queue = self._queues[rid] = asyncio.Queue()
        finished = False
        try:
            if self.on_submit is not None:
                self.on_submit(message)
            await self._send(message)
            while not finished:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._queues.pop(rid, None)
            if not finished and self.is_ready:
                await self.abort(rid, "the client went away")

    def end_in_flight(self, reason: str) -> int:
        """End every request in flight with EngineDeadError(`reason`) (the server is shutting down: each is
        aborted in the core as its iterator closes); returns how many there were."""
        for queue in self._queues.values():
            queue.put_nowait(EngineDeadError(reason))
        return len(self._queues)

    async def abort(self, request_id: str, error: str | None = None) -> None:
        with contextlib.suppress(EngineDeadError):   # a core that is gone runs nothing to abort
            await self._send(AbortRequest(request_id=request_id, error=error))

    async def _send(self, message) -> None:
        """Send one message to the core; EngineDeadError once the core is gone. A PUSH socket whose only peer has
        disconnected blocks a send until a peer connects again, which a dead core never does: the send is raced
        against the death the watch loop declares (within its poll period)."""
        if self._gone.is_set():
            raise EngineDeadError(self.dead_reason or f"the engine core is {self.state}")
        sending = asyncio.ensure_future(self._push.send(encode_message(message)))
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait((sending, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not sending.done():
                sending.cancel()
        if sending.cancelled():
            raise EngineDeadError(self.dead_reason or f"the engine core is {self.state}")
        sending.result()

    async def reset_prefix_cache(self) -> int:
        """Ask the core to drop every cached KV block no request references; returns how many it dropped.
        EngineDeadError if the core is not ready or dies before it answers (it answers after the step it is in,
        however long: a live core always answers)."""
        if not self.is_ready:
            raise EngineDeadError(self.dead_reason or f"the engine core is {self.state}")
        reset_id = next(self._reset_ids)
        answer = self._reset_answers[reset_id] = asyncio.get_running_loop().create_future()
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await self._send(ResetPrefixCache(reset_id=reset_id))
            await asyncio.wait((answer, gone), return_when=asyncio.FIRST_COMPLETED)
            if not answer.done():
                raise EngineDeadError(self.dead_reason or "the engine core did not answer the prefix-cache reset")
            return answer.result()
        finally:
            gone.cancel()
            self._reset_answers.pop(reset_id, None)

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the core (Shutdown message, then SIGTERM, then SIGKILL) and release sockets; idempotent."""
        if self.state == "stopped":
            return
        was_alive = self.process is not None and self.process.poll() is None
        was_ready = self.state == "ready"
        if was_ready:
            with contextlib.suppress(EngineDeadError):   # it died meanwhile: nothing to tell
                await self._send(Shutdown())
        self._set_dead("the engine core is shutting down", state="stopped")
        if was_alive and not was_ready:
            # Still loading (a stop during start-up): it holds nothing worth a graceful stop, and SIGTERM would
            # reach Paddle's fatal-signal handler, which prints a C++ crash dump.
            self.process.kill()
        if was_alive:
            await self._wait_exit(timeout_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._push.close(0)
        self._pull.close(0)
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)
        logger.info("engine core stopped")

    async def _wait_exit(self, timeout_s: float) -> None:
        for sig in ("wait", "terminate", "kill"):
            if sig != "wait":
                getattr(self.process, sig)()
            deadline = time.monotonic() + timeout_s
            while self.process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if self.process.poll() is not None:
                return

    async def _unlink_once_connected(self, monitors: list) -> None:
        """Remove the sockets' directory once the core has connected both: the connections outlive their files,
        and a server killed with SIGKILL (no clean-up) then leaves nothing behind in the temp directory."""
        try:
            for monitor in monitors:
                while parse_monitor_message(await monitor.recv_multipart())["event"] != zmq.EVENT_ACCEPTED:
                    pass
            shutil.rmtree(self._dir, ignore_errors=True)
        finally:
            for sock, monitor in zip((self._push, self._pull), monitors):
                sock.disable_monitor()
                monitor.close(0)

    async def _receive_loop(self) -> None:
        while True:
            frame = await self._pull.recv()
            self._last_message = time.monotonic()
            try:
                message = decode_message(frame)
            except ValueError as error:
                message = self._salvage(frame, error)
                if message is None:
                    continue
            if isinstance(message, StepOutputs):
                self.stats = message.stats
                if self.on_outputs is not None:
                    self.on_outputs(message)
                for delta in message.deltas:
                    queue = self._queues.get(delta.request_id)
                    if queue is not None:
                        queue.put_nowait(delta)
                for reset_id, dropped in message.prefix_cache_resets.items():
                    answer = self._reset_answers.get(reset_id)
                    if answer is not None and not answer.done():
                        answer.set_result(dropped)
            elif isinstance(message, Heartbeat):
                self._beat, self._beat_at = message, self._last_message
            elif isinstance(message, Ready):
                self.ready_info = message.info
                self.state = "ready"
                self._ready.set()
                logger.info("engine core ready (pid %d)", self.process.pid)
            elif isinstance(message, CoreFailed):
                self._set_dead(f"the engine core failed: {message.error}")

    def _salvage(self, frame: bytes, error: ValueError) -> StepOutputs | None:
        """A frame that did not decode: its valid deltas, when it is a StepOutputs; each invalid delta fails only
        its own request (with an error naming why)."""
        salvaged = salvage_step_outputs(frame)
        if salvaged is None:
            logger.error("engine core sent a bad frame: %s", error)
            return None
        outputs, dropped = salvaged
        for request_id, why in dropped:
            logger.error("engine core sent an invalid update for request %s: %s", request_id, why)
            queue = self._queues.get(request_id) if request_id is not None else None
            if queue is not None:
                outputs.deltas.append(RequestDelta(request_id=request_id, new_token_ids=[], finished=True,
                                                   finish_reason="abort", error=f"the engine core sent an "
                                                                                f"invalid update: {why}"))
        return outputs

    async def _watch_loop(self) -> None:
        while self.state in ("starting", "ready"):
            await asyncio.sleep(0.1)
            status = self.process.poll()
            silent = time.monotonic() - self._last_message
            busy = self._busy_s()
            if status is not None:
                self._set_dead(f"the engine core exited with status {status}")
            elif self.state == "ready" and silent > self.heartbeat_timeout_s and not self._frame_waiting():
                self.process.kill()
                self._set_dead(f"the engine core sent no heartbeat for {silent:.0f} s")
            elif self.state == "ready" and self.step_timeout_s and busy > self.step_timeout_s:
                self.process.kill()
                self._set_dead(f"one engine core step ran for {busy:.0f} s, over --step-timeout-s "
                               f"({self.step_timeout_s:g} s)")
            elif self.state == "starting" and time.monotonic() - self._started > self.ready_timeout_s:
                self.process.kill()
                self._set_dead(f"the engine core was not ready after {self.ready_timeout_s:.0f} s")
            else:
                self._warn_if_busy(busy)

    def _frame_waiting(self) -> bool:
        """A frame from the core is waiting unread: it is this process that fell behind (starved of the CPU on a
        loaded machine), not the core that went silent."""
        return bool(self._pull.getsockopt(zmq.EVENTS) & zmq.POLLIN)

    def _busy_s(self) -> float:
        """How long the core's running step-loop turn has run, by its latest heartbeat (0 between turns)."""
        return self._beat.busy_s and self._beat.busy_s + time.monotonic() - self._beat_at

    def _warn_if_busy(self, busy: float) -> None:
        """One line per heartbeat timeout a turn lasts: what would have been taken for death is visible."""
        turn, warned = self._busy_warned
        if turn != self._beat.turns:
            warned = 0.0
        if busy > warned + self.heartbeat_timeout_s:
            self._busy_warned = (self._beat.turns, busy)
            logger.warning("engine core busy: step-loop turn %d has run for %.0f s (alive: its heartbeat goes on)",
                           self._beat.turns + 1, busy)

    def _set_dead(self, reason: str, state: str = "dead") -> None:
        if self.state in ("dead", "stopped"):
            return
        if state == "dead":
            logger.error("engine core lost: %s", reason)
        self.state, self.dead_reason = state, reason
        self._ready.set()
        self._gone.set()
        for queue in self._queues.values():
            queue.put_nowait(EngineDeadError(reason))
        if state == "dead" and self.on_dead is not None:
            self.on_dead(reason)
