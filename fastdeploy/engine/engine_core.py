"""Runs one instance's step loop in its own process, fed and reported over ZeroMQ (SERVICES §1).

The API server starts this module as a process (`python -m fastdeploy.engine.engine_core ...`). The instance is
built by a builder function named on the command line (`module:function`, called with the API server's parsed
flags, which arrive on stdin), imported only here, at process start: that is where Paddle gets loaded, never in
the API server and never by importing this module. Each processed step sends one `StepOutputs` message with the delta of every request that
changed, so the front end streams tokens as the engine produces them. A thread of its own sends the heartbeat
(engine/pulse.py) with the step loop's progress, so a long step is not silence: that is how the API server tells a
wedged or dead core from a busy one.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import logging
import os
import signal

if __name__ == "__main__":   # before the imports below: Ctrl-C reaches the API server, which shuts this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # down; a KeyboardInterrupt while they load would print a traceback

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from fastdeploy.model_executor.models.checkpoint import CheckpointError
from fastdeploy.schema.core_protocol import (AbortRequest, AddRequest, CoreFailed, EngineStats, PrefixCacheStats, Ready,
                                             RequestDelta, ResetPrefixCache, Shutdown, StepOutputs, decode_message,
                                             encode_message)
from fastdeploy.schema.request import FINISH_ABORT, Request, RequestIdInUseError, RequestStatus
from fastdeploy.engine.pulse import Pulse
from fastdeploy.engine.resource_manager import ResourceStats
from fastdeploy.schema.sampling_params import SamplingParams

logger = logging.getLogger("fastdeploy.engine_core")

HEARTBEAT_S = 0.5


class EngineInstance(Protocol):
    """What the engine core hosts: `LLMEngine`'s surface, the same for every role (the role only changes the KV
    connector inside it)."""

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    stop_seqs: tuple[tuple[int, ...], ...] = (), prompt: str | None = None,
                    disaggregate_info: dict | None = None) -> Request: ...

    def abort(self, request_id: str, error: str | None = None) -> bool: ...

    def step(self) -> list[Request]: ...

    def take_in(self) -> None:
        """Take in what the peer sent, without waiting and without computing (the start of `step`)."""

    def has_unfinished(self) -> bool: ...

    def stats(self) -> ResourceStats: ...

    def num_waiting(self) -> int: ...

    def describe(self) -> dict:
        """What the router registers and pairs on (SERVICES §5): role, config hash, connector address (PD)."""

    def pd_counters(self) -> dict | None:
        """The SERVICES §4 PD metrics since the previous call; None for a mixed instance."""

    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The prefix cache's cumulative lookups; None with prefix caching off."""

    def reset_prefix_cache(self) -> int:
        """Drop every cached KV block no request references; returns how many."""

    def close(self) -> None:
        """Release what the instance holds outside the process (a PD connector's sockets)."""


class EngineCore:
    """The loop's logic without sockets: apply input messages, step, turn request progress into deltas."""

    def __init__(self, instance: EngineInstance):
        self.instance = instance
        self._live: dict[str, Request] = {}
        self._sent: dict[str, int] = {}          # output tokens already reported per live request id (-1: none yet)
        self._pending: list[RequestDelta] = []   # refused requests, reported with the next step
        self._phases: dict[str, _Phases] = {}    # per live request: when it arrived, got a slot, got a token
        self._resets: dict[int, int] = {}        # ResetPrefixCache answers, sent with the next step's outputs
        self._step_times: list = []              # the StepTimes of the instance's computing steps since the last
        if hasattr(instance, "step_times_sink"):  # report (LLMEngine's; a test double may have none)
            instance.step_times_sink = self._step_times.append

    @property
    def has_work(self) -> bool:
        return bool(self._pending or self._resets) or self.instance.has_unfinished()

    def handle(self, message) -> None:
        if isinstance(message, AddRequest):
            self._add(message)
        elif isinstance(message, AbortRequest):
            self.abort(message.request_id, message.error)
        elif isinstance(message, ResetPrefixCache):
            self._resets[message.reset_id] = self.instance.reset_prefix_cache()
        else:
            raise ValueError(f"EngineCore.handle: unexpected message {type(message).__name__}")

    def abort(self, request_id: str, error: str | None) -> None:
        if request_id in self._live:
            self.instance.abort(request_id, error)

    def abort_all(self, error: str) -> None:
        for request_id in list(self._live):
            self.instance.abort(request_id, error)

    def step(self) -> StepOutputs:
        """One engine step when there is work, and the deltas since the previous call."""
        started = time.perf_counter()
        if self.instance.has_unfinished():
            self.instance.step()
        ended = time.perf_counter()
        deltas, self._pending = self._pending, []
        for request_id, request in list(self._live.items()):
            self._phases[request_id].observe(request, started, ended)
            delta = self._delta(request, ended)
            if delta is not None:
                deltas.append(delta)
        resets, self._resets = self._resets, {}
        host = [t.host for t in self._step_times]
        if host:   # the deltas just built are this step's outputs: part of its host work
            host[-1] += time.perf_counter() - ended
        self._step_times.clear()
        return StepOutputs(deltas=deltas, stats=self.stats(), prefix_cache_resets=resets, step_host_seconds=host)

    def take_in(self) -> StepOutputs | None:
        """Before a step: what the peer sent taken in, and the deltas known already, or None when there are none.
        A request D received from P holds its first token (P computed it) from the moment its hand-off is taken
        in; reporting it here, not after the step that follows, saves its client that step's model run (a whole
        decode round of every running request). A request added since the last step is acknowledged here too."""
        if not self._live:
            return None
        self.instance.take_in()
        now = time.perf_counter()
        deltas = []
        for request_id, request in list(self._live.items()):
            self._phases[request_id].observe(request, now, now)
            delta = self._delta(request, now)
            if delta is not None:
                deltas.append(delta)
        return StepOutputs(deltas=deltas, stats=self.stats()) if deltas else None

    def stats(self) -> EngineStats:
        s = self.instance.stats()
        return EngineStats(num_running=s.running_requests, num_waiting=self.instance.num_waiting(),
                           free_slots=s.free_slots, total_slots=s.total_slots, free_kv_blocks=s.free_kv_blocks,
                           total_kv_blocks=s.total_kv_blocks, pd=self.instance.pd_counters(),
                           prefix_cache=self.instance.prefix_cache_stats())

    def _add(self, message: AddRequest) -> None:
        rid = message.request_id
        try:
            if rid in self._live:
                raise RequestIdInUseError(f"request {rid}: 'request_id' is already in use")
            params = SamplingParams(**message.params)
            request = self.instance.add_request(rid, list(message.prompt_token_ids), params,
                                                tuple(tuple(s) for s in message.stop_seqs), prompt=message.prompt,
                                                disaggregate_info=message.disaggregate_info)
        except Exception as error:   # noqa: BLE001 - a request the instance cannot take fails alone
            if not isinstance(error, (ValueError, TypeError, RequestIdInUseError)):
                logger.exception("engine core: request %s could not be added", rid)
            self._pending.append(RequestDelta(request_id=rid, new_token_ids=[], finished=True,
                                              finish_reason=FINISH_ABORT, error=str(error), rejected=True,
                                              id_in_use=isinstance(error, RequestIdInUseError),
                                              num_prompt_tokens=len(message.prompt_token_ids)))
            return
        self._live[rid] = request
        self._sent[rid] = -1   # not acknowledged yet
        self._phases[rid] = _Phases(arrival=time.perf_counter())

    def _delta(self, request: Request, now: float) -> RequestDelta | None:
        """New tokens since the last report; the first report of a request is sent even if empty (it tells the
        API server the request was accepted)."""
        rid = request.request_id
        tokens = request.output_token_ids
        sent = self._sent[rid]
        finished = request.status is RequestStatus.FINISHED
        if len(tokens) == sent and not finished:
            return None
        self._sent[rid] = len(tokens)
        delta = RequestDelta(request_id=rid, new_token_ids=list(tokens[max(sent, 0):]))
        if request.params.logprobs is not None:
            delta.new_logprobs = request.output_logprobs[max(sent, 0):]
        if finished:
            del self._live[rid], self._sent[rid]
            m = request.metrics
            delta.finished, delta.finish_reason, delta.error = True, request.finish_reason, request.error
            delta.pair_mismatch = request.pair_mismatch
            delta.num_prompt_tokens, delta.num_output_tokens = len(request.prompt_token_ids), len(tokens)
            delta.num_cached_tokens = request.num_cached_tokens
            delta.num_decode_rounds, delta.num_draft_tokens = m.num_decode_rounds, m.num_draft_tokens
            delta.num_accepted_drafts = m.num_accepted_drafts
            self._phases.pop(rid).report(delta, now)
        return delta


@dataclass(slots=True)
class _Phases:
    """When one request arrived at the core, first got a slot and first had an output token (perf_counter s).

    Observed around each step, from the request's status and tokens, so no engine layer keeps clocks for it:
    admission happens at the start of a step, so a request first seen holding a slot (or tokens) after a step got
    it when that step started; a token first seen after a step came at its end."""

    arrival: float
    scheduled: float | None = None
    first_token: float | None = None

    def observe(self, request: Request, started: float, ended: float) -> None:
        if self.scheduled is None and (request.status is RequestStatus.RUNNING or request.output_token_ids):
            self.scheduled = started
        if self.first_token is None and request.output_token_ids:
            self.first_token = ended

    def report(self, delta: RequestDelta, finished: float) -> None:
        """The FastDeploy phase durations of a finished request (docs/serving.md "Metrics")."""
        if self.scheduled is not None:
            delta.queue_time_s = self.scheduled - self.arrival
            delta.inference_time_s = finished - self.scheduled
            if self.first_token is not None:
                delta.prefill_time_s = self.first_token - self.scheduled
        if self.first_token is not None:
            delta.decode_time_s = finished - self.first_token


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the parent exits (PR_SET_PDEATHSIG); the loop also polls getppid()."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def load_builder(path: str) -> Callable[[argparse.Namespace], EngineInstance]:
    """`module:function` -> the function (imported now, in the engine core process)."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"engine_core: argument '--builder' must be 'module:function', got {path!r}")
    return getattr(importlib.import_module(module), name)


def serve(core: EngineCore, pull, push, parent_pid: int, heartbeat_s: float = HEARTBEAT_S) -> int:
    """The process loop: drain input, step, report; returns the exit status. The heartbeat goes out from its own
    thread (`Pulse`) every `heartbeat_s`, however long a step runs; it shares `push` under a lock (a ZeroMQ
    socket is safe across threads only when its users never overlap)."""
    import zmq
    lock = threading.Lock()

    def send(message) -> None:
        frame = encode_message(message)
        with lock:
            push.send(frame)

    def beat(message) -> None:
        """Never blocks for long: an API server that reads nothing would not see the beat anyway."""
        frame = encode_message(message)
        if lock.acquire(timeout=heartbeat_s):
            try:
                push.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                pass
            finally:
                lock.release()

    pulse = Pulse(beat, heartbeat_s)
    pulse.start()
    try:
        return _loop(core, pull, send, parent_pid, heartbeat_s, pulse)
    finally:
        pulse.stop()


def _loop(core: EngineCore, pull, send, parent_pid: int, heartbeat_s: float, pulse: Pulse) -> int:
    import zmq
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    last_sent = 0.0
    while True:
        timeout_ms = 0 if core.has_work else int(heartbeat_s * 1000)
        if poller.poll(timeout_ms):
            while True:
                try:
                    message = decode_message(pull.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                if isinstance(message, Shutdown):
                    core.abort_all("the engine core is shutting down")
                    send(core.step())
                    return 0
                core.handle(message)
        if os.getppid() != parent_pid:
            logger.error("engine core: parent %d is gone, exiting", parent_pid)
            return 1
        with pulse.busy():
            early = core.take_in()
            if early is not None:
                send(early)
            outputs = core.step()
        now = time.monotonic()
        if outputs.deltas or outputs.prefix_cache_resets or now - last_sent >= heartbeat_s:
            send(outputs)   # an idle core's load, refreshed every heartbeat_s
            last_sent = now


def heartbeat_interval(flags: argparse.Namespace) -> float:
    """HEARTBEAT_S, or a fifth of a shorter --heartbeat-timeout-s: a few late beats never add up to a timeout."""
    timeout = getattr(flags, "heartbeat_timeout_s", None)
    return HEARTBEAT_S if not timeout else min(HEARTBEAT_S, timeout / 5)


def read_flags(stream) -> argparse.Namespace:
    """The API server's parsed flags: one JSON object on stdin, never on the command line, where every local
    user can read it (`ps`, /proc/<pid>/cmdline) and where a flag such as a secret would show."""
    try:
        flags = json.loads(stream.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"engine_core: the flags on stdin are not JSON ({error})") from None
    if not isinstance(flags, dict):
        raise ValueError("engine_core: the flags on stdin must be one JSON object")
    return argparse.Namespace(**flags)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fastdeploy.engine.engine_core",
                                     description="the API server's flags are read as a JSON object from stdin")
    parser.add_argument("--builder", required=True, help="module:function building the instance from the flags")
    parser.add_argument("--input", required=True, help="ZeroMQ address to PULL requests from")
    parser.add_argument("--output", required=True, help="ZeroMQ address to PUSH outputs to")
    parser.add_argument("--parent-pid", type=int, required=True)
    opts = parser.parse_args(argv)
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import zmq
    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    pull.connect(opts.input)
    push.connect(opts.output)
    push.setsockopt(zmq.LINGER, 2000)
    try:
        flags = read_flags(sys.stdin.buffer)
        instance = load_builder(opts.builder)(flags)
        # Loading Paddle installed its fatal-signal handler for SIGTERM (a C++ crash dump): a SIGTERM sent to the
        # whole process group stops this process quietly instead.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        core = EngineCore(instance)
        # The load first, then Ready: the API server's gauges are right from its first /health 200.
        push.send(encode_message(StepOutputs(deltas=[], stats=core.stats())))
        push.send(encode_message(Ready(info={"pid": os.getpid(), **instance.describe()})))
        logger.info("engine core %d: ready", os.getpid())
        try:
            status = serve(core, pull, push, opts.parent_pid, heartbeat_interval(flags))
        finally:
            instance.close()
    except CheckpointError as error:   # a user's bad checkpoint: its one line, not a traceback
        logger.error("engine core: %s", error)
        push.send(encode_message(CoreFailed(error=str(error))))
        status = 1
    except Exception as error:   # noqa: BLE001 - reported to the API server, then the process dies
        logger.exception("engine core failed")
        push.send(encode_message(CoreFailed(error=f"{type(error).__name__}: {error}")))
        status = 1
    logger.info("engine core %d: shutdown (status %d)", os.getpid(), status)
    pull.close(0)
    push.close()
    context.term()
    return status


if __name__ == "__main__":
    sys.exit(main())
