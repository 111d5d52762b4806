"""Copies of one model runner's state between the state ops of a step, for the invariant checks (I1, I4, I6 of
PD_MTP_FLOW §9) in trace_checks.py. Test-only: it wraps the runner's step and the op entries its post-process
calls, so the package's step code carries no tracing branch.

`StateTracer(runner)` records, for each step of that runner: the stop flags at verify entry, accept_num,
seq_lens_decoder and preempted_idx as speculate_save_output reads them, and the state after post-process (before
the proposer and schedule_cache run), plus which pre_ids rows speculate_set_value_by_flags_and_idx wrote.
Host-place runners only (their state is the ops' tensors).
"""
from __future__ import annotations

import contextvars
from dataclasses import dataclass

import numpy as np

from fastdeploy.model_executor import xpu_pre_and_post_process as step_ops


@dataclass(slots=True)
class SlotStateTrace:
    """Arrays are [B]."""

    stop_flags_at_entry: np.ndarray       # after insertion and recovery, before verify
    stop_flags: np.ndarray                # after post-process 7.5
    accept_num_reported: np.ndarray       # after speculate_update (7.2): what save_output reads
    seq_lens_decoder_reported: np.ndarray  # after speculate_update (7.2)
    prompt_lens: np.ndarray
    preempted_at_entry: np.ndarray        # preempted_idx before save_output
    accept_num: np.ndarray                # after 7.5
    seq_lens_decoder: np.ndarray          # after 7.5
    pre_ids_written: np.ndarray           # slots whose pre_ids row changed during 7.5


_active: contextvars.ContextVar[StateTracer | None] = contextvars.ContextVar("state_tracer", default=None)


class _TracedOps:
    """Stands in for the state-op module inside xpu_pre_and_post_process: forwards every op, taking the active
    tracer's copies around the two ops the checks need."""

    def __init__(self, ops):
        self._ops = ops

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def speculate_set_stop_value_multi_seqs(self, *args):
        tracer = _active.get()
        if tracer is not None and tracer.entry_flags is None:    # verify did not run (no token this step)
            tracer.entry_flags = tracer.state.stop_flags.copy()
        return self._ops.speculate_set_stop_value_multi_seqs(*args)

    def speculate_save_output(self, *args):
        tracer = _active.get()
        if tracer is not None:
            s = tracer.state
            tracer.reported = (s.accept_num.copy(), s.seq_lens_decoder.copy(), s.preempted_idx.copy())
        return self._ops.speculate_save_output(*args)

    def speculate_set_value_by_flags_and_idx(self, *args):
        tracer = _active.get()
        before = tracer.state.pre_ids.copy() if tracer is not None else None
        result = self._ops.speculate_set_value_by_flags_and_idx(*args)
        if tracer is not None:
            tracer.finish_post_process(before)
        return result


def _install() -> None:
    """Once per process: route the step module's op calls and verify through the tracer hooks."""
    if isinstance(step_ops.ops, _TracedOps):
        return
    step_ops.ops = _TracedOps(step_ops.ops)
    verify = step_ops.verify

    def traced_verify(state, *args):
        tracer = _active.get()
        if tracer is not None:
            tracer.entry_flags = state.stop_flags.copy()
        return verify(state, *args)

    step_ops.verify = traced_verify


class StateTracer:
    """Wraps `runner.execute_model`; `last` is the trace of its latest step (None for a step without message)."""

    def __init__(self, runner):
        _install()
        self.state = runner.state
        self.last: SlotStateTrace | None = None
        self.entry_flags: np.ndarray | None = None
        self.reported: tuple[np.ndarray, ...] | None = None
        execute = runner.execute_model

        def traced_execute(plan):
            self.last = self.entry_flags = self.reported = None
            token = _active.set(self)
            try:
                return execute(plan)
            finally:
                _active.reset(token)

        runner.execute_model = traced_execute

    def finish_post_process(self, pre_ids_before: np.ndarray) -> None:
        s = self.state
        accept_num, dec, preempted = self.reported
        self.last = SlotStateTrace(
            stop_flags_at_entry=self.entry_flags, stop_flags=s.stop_flags.copy(), accept_num_reported=accept_num,
            seq_lens_decoder_reported=dec, prompt_lens=s.prompt_lens.copy(),
            preempted_at_entry=preempted.astype(np.bool_), accept_num=s.accept_num.copy(),
            seq_lens_decoder=s.seq_lens_decoder.copy(), pre_ids_written=np.any(s.pre_ids != pre_ids_before, axis=1))
