"""Turns a step plan into one model step, in the normative order of OPS §4, for every device and role.

The device runners (xpu_model_runner.py, gpu_model_runner.py) only name their device and op backend: task
insertion, including the D-side first-round insertion of PD_MTP_FLOW §5.3, and the step loop live here once, so
a fix to either is made in one place.
"""
from __future__ import annotations

import time

import numpy as np
import paddle

from fastdeploy.config import FDConfig
from fastdeploy.schema.step_io import (DecodeTask, PrefillTask, PreemptTask, RunnerOutput, SlotSampling, StepPlan,
                                      StepTimes)
from fastdeploy.model_executor import xpu_pre_and_post_process as step_ops
from fastdeploy.model_executor.models import Model
from fastdeploy.model_executor.sampler import DistributionHook, SlotControls
from fastdeploy.model_executor.ops import state_ops as ops
from fastdeploy.model_executor.ops.step_message import UNALLOCATED_BLOCK
from fastdeploy.model_executor.step_state import ShareInputs
from fastdeploy.spec_decode.base import Proposal
from fastdeploy.spec_decode.mtp import MTPProposer


class ModelRunnerBase:
    def __init__(self, config: FDConfig, model: Model):
        self.config, self.model = config, model
        self.k = config.num_speculative_tokens
        self.block_size = config.cache.block_size
        self.role = config.role
        sched = config.scheduler
        self.state = ShareInputs.allocate(sched.max_num_seqs, self.k, sched.max_model_len, config.blocks_per_seq,
                                          sched.max_stop_seqs, sched.max_stop_seq_len, model.eos_token_ids)
        self.place = self.resolve_place()
        self.state.attach_views(self.to_device, zero_copy=self.shares_host_memory())
        self.kv = model.new_kv_cache(config.cache.num_kv_blocks, self.block_size,
                                     None if self.place.is_cpu_place() else self.place, config.kv_dtype)
        self.proposer = (MTPProposer(model, self.kv, sched.max_num_seqs, self.k, sched.max_model_len)
                         if self.k > 0 else None)
        self.sampling: list[SlotSampling | None] = [None] * sched.max_num_seqs
        self.controls = SlotControls(sched.max_num_seqs)   # self.sampling's, as arrays for verify
        # sees the distribution each emitted position is drawn from (sampler.DistributionHook); None: not built
        self.distribution_hook: DistributionHook | None = None

    @property
    def op_backend(self) -> str:
        """The op backend name given to ops.use_backend (OPS §2.1)."""
        raise NotImplementedError

    def resolve_place(self) -> paddle.CPUPlace | paddle.XPUPlace:
        """The place the state tensors live on: the host unless a subclass runs the ops on a device."""
        return paddle.CPUPlace()

    def shares_host_memory(self) -> bool:
        """True when to_device's tensors are the NumPy arrays' memory (the host place): no copies between stages."""
        return self.place.is_cpu_place()

    def to_device(self, array: np.ndarray) -> paddle.Tensor:
        """The ops' tensor for `array` on the runner's place: on the host a zero-copy DLPack view (same memory),
        on a device a copy (kept in step by ShareInputs.push / pull)."""
        if self.place.is_cpu_place():
            return paddle.from_dlpack(array)
        return paddle.to_tensor(array, place=self.place)

    # ---- the step (OPS §4) ----

    def execute_model(self, plan: StepPlan) -> RunnerOutput:
        times = StepTimes()
        times.start(time.perf_counter())
        with ops.use_backend(self.op_backend):
            self.insert_tasks(plan)                                                   # 1
            step_ops.recover_parked_slots(self.state, self.block_size, self.k)        # 2
            packed = step_ops.pre_process(self.state)                                 # 3
            if not self.state.read_not_need_stop():                                   # 4
                times.lap("prepare", time.perf_counter())
                return self._no_message(times)
            hidden, draft_counts, logprob_rows = self._forward_and_verify(packed, times)  # 5, 6
            message = step_ops.post_process(self.state)                               # 7.1-7.5
            times.lap("state_ops", time.perf_counter())
            proposal = self._propose_next(packed, hidden, times)                      # 8
            step_ops.schedule_cache(self.state, self.block_size, self.k, self.role == "prefill")  # 10
            times.lap("state_ops", time.perf_counter())
        output = RunnerOutput(message=message, draft_counts=draft_counts,
                              parked_slots=tuple(np.flatnonzero(self.state.is_block_step).tolist()),
                              forward_seconds=times.passes, first_draft_tokens=self._first_drafts(proposal),
                              logprobs=step_ops.emitted_logprobs(message, logprob_rows, self.sampling), times=times)
        times.lap("outputs", time.perf_counter())
        return output

    def _forward_and_verify(self, packed: step_ops.PackedStep, times: StepTimes
                            ) -> tuple[paddle.Tensor | None, np.ndarray, dict[int, np.ndarray]]:
        """Stages 5 and 6: (target hidden [N, H], draft counts [B], the verified positions' log_softmax rows of
        the slots that asked for logprobs: slot -> [n, V] float64), timing the pass into `times`. A step whose
        only task was a preemption packs no token and skips both."""
        draft_counts = np.full(self.state.stop_flags.shape[0], -1, np.int32)
        if not packed.batch.num_tokens:
            times.lap("prepare", time.perf_counter())
            return None, draft_counts, {}
        rows = step_ops.logit_rows(self.state, packed)
        started = time.perf_counter()
        times.lap("prepare", started)
        logits, hidden = self.model.forward(packed.batch, self.kv, rows)
        seconds = time.perf_counter() - started
        times.passes += seconds
        logits = logits.numpy()
        draft_counts = step_ops.verify(self.state, packed, logits, self.sampling, self.controls,
                                       self.distribution_hook)
        logprob_rows = step_ops.verified_logprob_rows(self.state, packed, logits, self.sampling,
                                                      self.controls)
        times.lap("sample_verify", time.perf_counter(), minus=seconds)
        return hidden, draft_counts, logprob_rows

    def _no_message(self, times: StepTimes) -> RunnerOutput:
        output = RunnerOutput(message=np.zeros(0, np.int64),
                              draft_counts=np.full(self.state.stop_flags.shape[0], -1, np.int32),
                              parked_slots=tuple(np.flatnonzero(self.state.is_block_step).tolist()), times=times)
        times.lap("outputs", time.perf_counter())
        return output

    def _propose_next(self, packed: step_ops.PackedStep, hidden: paddle.Tensor | None,
                      times: StepTimes) -> Proposal | None:
        """Stage 8. Without speculation (K = 0) every running slot feeds its one last token next step; with MTP
        each slot the proposer ran for feeds its last token and its drafts (draft_tokens[b, 1:]), unless no slot
        ran (then nothing changed). The proposer only drafts; the target's state is written here."""
        s = self.state
        if self.proposer is None:
            s.seq_lens_this_time[:] = np.where(s.stop_flags, 0, 1)
            return None
        if hidden is None:
            return None
        proposal = self.proposer.propose(s, packed, hidden)
        times.passes += proposal.forward_seconds
        times.lap("draft", time.perf_counter(), minus=proposal.forward_seconds)
        s.seq_lens_this_time[s.stop_flags] = 0
        ran = np.flatnonzero(proposal.num_drafts >= 0)
        n = proposal.num_drafts[ran]
        drafted = np.arange(self.k) < n[:, None]        # draft_tokens[b, 1 : 1 + n] = the slot's n drafts
        s.draft_tokens[ran, 1:] = np.where(drafted, proposal.draft_tokens[ran], s.draft_tokens[ran, 1:])
        s.seq_lens_this_time[ran] = 1 + n
        return proposal

    def _first_drafts(self, proposal: Proposal | None) -> np.ndarray | None:
        """Stage 8a on P (PD_MTP_FLOW §4.3): d1 of each slot whose prompt completed with a t0 that did not stop
        it. The proposer drafts exactly once for such a slot and nothing for a slot stopped at t0, and a slot
        still in an intermediate chunk gets no draft, so its first draft column is d1 or -1."""
        if self.role != "prefill" or self.k == 0:
            return None
        if proposal is None:
            return np.full(self.state.stop_flags.shape[0], -1, np.int64)
        return proposal.draft_tokens[:, 0].copy()

    # ---- stage 1: task insertion ----

    def insert_tasks(self, plan: StepPlan) -> None:
        for task in plan.preempt_tasks:
            self._insert_preempt(task)
        for task in plan.prefill_tasks:
            self._insert_prefill(task)
        for task in plan.decode_tasks:
            self._insert_first_round(task)
        for task in plan.block_table_tasks:
            self._set_block_table(task.slot, task.block_ids)
        if plan.num_tasks:
            self.state.not_need_stop[0] = True

    def _set_block_table(self, slot: int, block_ids: tuple[int, ...]) -> None:
        self.state.block_tables[slot] = UNALLOCATED_BLOCK
        self.state.block_tables[slot, :len(block_ids)] = block_ids

    def _reset_slot(self, slot: int, sampling: SlotSampling, block_ids: tuple[int, ...]) -> None:
        """Fields every insertion of a new residency writes the same way."""
        s = self.state
        s.pre_ids[slot] = -1
        s.accept_num[slot] = 0
        s.actual_draft_token_nums[slot] = self.k
        s.mask_rollback[slot] = 0
        s.is_block_step[slot] = False
        s.step_seq_lens_decoder[slot] = 0
        s.preempted_idx[slot] = 0
        s.min_dec_len[slot] = sampling.min_tokens
        s.max_dec_len[slot] = sampling.max_tokens
        s.stop_seqs[slot] = -1
        s.stop_seqs_len[slot] = 0
        for t, seq in enumerate(sampling.stop_seqs):
            s.stop_seqs[slot, t, :len(seq)] = seq
            s.stop_seqs_len[slot, t] = len(seq)
        self._set_block_table(slot, block_ids)
        self.sampling[slot] = sampling
        self.controls.set(slot, sampling)

    def _insert_prefill(self, task: PrefillTask) -> None:
        """PD_MTP_FLOW §4.1; a recomputed request's final chunk restores step_idx and pre_ids (PD_MTP_FLOW §7.2)."""
        s, b = self.state, task.slot
        if task.is_first_chunk:
            self._reset_slot(b, task.sampling, task.block_ids)
            s.input_ids[b, :task.prefill_len] = task.token_ids
        else:
            self._set_block_table(b, task.block_ids)
        s.seq_lens_encoder[b] = s.seq_lens_this_time[b] = task.end - task.start
        s.seq_lens_decoder[b] = task.start
        s.prompt_lens[b] = task.prefill_len
        s.stop_flags[b] = False
        known_outputs = len(task.output_token_ids) if task.completes_prefill else 0
        s.step_idx[b] = known_outputs
        s.pre_ids[b, 1:1 + known_outputs] = task.output_token_ids[:known_outputs]
        if self.proposer is not None:
            self.proposer.insert_prefill(task)

    def _insert_first_round(self, task: DecodeTask) -> None:
        """D side, PD_MTP_FLOW §5.3: the slot resumes where P stopped, feeding [t0, d1] (or [t0]) at L, L + 1."""
        s, b = self.state, task.slot
        self._reset_slot(b, task.sampling, task.block_ids)
        width = min(len(task.draft_token_ids), self.k + 1)
        t0 = task.draft_token_ids[0]
        s.stop_flags[b] = False
        s.seq_lens_encoder[b] = 0
        s.seq_lens_decoder[b] = task.prompt_len
        s.seq_lens_this_time[b] = width
        s.prompt_lens[b] = task.prompt_len + 1
        s.step_idx[b] = 1
        s.draft_tokens[b] = -1
        s.draft_tokens[b, :width] = task.draft_token_ids[:width]
        s.pre_ids[b, 1] = t0
        s.input_ids[b, 0] = t0
        if self.proposer is not None:
            self.proposer.insert_first_round(task)

    def _insert_preempt(self, task: PreemptTask) -> None:
        """PD_MTP_FLOW §7.2: the slot reports -9 once; the engine frees it after that report."""
        s, b = self.state, task.slot
        s.preempted_idx[b] = 1
        s.block_tables[b] = UNALLOCATED_BLOCK
        s.stop_flags[b] = True
        s.seq_lens_this_time[b] = s.seq_lens_encoder[b] = s.seq_lens_decoder[b] = 0
        s.is_block_step[b] = False
        s.accept_num[b] = 0
        if self.proposer is not None:
            self.proposer.stop(b)
