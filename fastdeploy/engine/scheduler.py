"""Decides, each step, which requests compute which tokens; the result is a typed StepPlan.

There is no prefill phase and no decode phase here, only requests whose KV must catch up with their known tokens
(`num_computed_tokens` towards `prefill_len`, in chunks under a token budget) and requests that decode one round
per step. Every decision reduces to: which request gets a slot, which gets KV blocks, and, when nothing at all can
run, which request is preempted (the newest, recomputed later from its prompt and outputs; PD_MTP_FLOW §7.2).
The scheduler never touches a tensor; the runner parks slots it cannot feed, and the scheduler resumes them.
"""
from __future__ import annotations

import random
from collections import deque

from fastdeploy.config import FDConfig
from fastdeploy.engine.request import Request, RequestStatus
from fastdeploy.engine.resource_manager import ResourceManager
from fastdeploy.engine.step_io import BlockTableTask, PrefillTask, PreemptTask, SlotSampling, StepPlan


class Scheduler:
    def __init__(self, config: FDConfig, resources: ResourceManager):
        self.k = config.num_speculative_tokens
        # A prompt's final chunk also takes the blocks of the 2K + 3 positions after it: the first decode round's
        # inputs and the lookahead speculate_schedule_cache checks after it (OPS §5.4 row Park: dec + 2K + 2).
        self.first_round_lookahead = 2 * self.k + 3
        self.token_budget = config.scheduler.max_num_batched_tokens
        self.resources = resources
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []      # in arrival order
        self._step = 0
        self._pending_preempts: list[PreemptTask] = []   # abort() of running requests, sent with the next plan
        self._seed_source = random.SystemRandom()

    # ---- request lifecycle (called by the engine and the token processor) ----

    def add_request(self, request: Request) -> None:
        seed = request.params.seed
        request.seed = self._seed_source.randrange(2 ** 31) if seed is None else seed
        request.prefill_len = request.num_tokens
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, request: Request, reason: str, error: str | None = None) -> None:
        """Finish a running request and free its slot and blocks in the same call (PD_MTP_FLOW §6)."""
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.error = error
        self._forget(request)
        self.resources.release(request)

    def _forget(self, request: Request) -> None:
        """Drop a finishing request from the queue that holds it (on a single instance: the running set)."""
        self.running.remove(request)

    def abort(self, request: Request, error: str | None = None) -> bool:
        """Stop a live request. A waiting one is finished at once; a running one is preempted through the normal
        path (PreemptTask, then the -9 report), and the token processor finishes it with "abort" and frees its
        slot and blocks in the step that reports -9. False if the request is finished or already aborting."""
        if request.status is RequestStatus.FINISHED or request.is_aborting:
            return False
        request.error = error or "aborted"
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
            request.status = RequestStatus.FINISHED
            request.finish_reason = "abort"
            return True
        request.is_aborting = True
        if not request.is_preempting:   # a preemption already in flight reports -9 anyway
            request.is_preempting = True
            self._pending_preempts.append(PreemptTask(request.slot))
        return True

    def find(self, request_id: str) -> Request | None:
        """The live (waiting or running) request with this id."""
        for request in (*self.running, *self.waiting):
            if request.request_id == request_id:
                return request
        return None

    def requeue_preempted(self, request: Request) -> None:
        """The runner acknowledged the preemption (-9): free everything, recompute prompt + outputs later."""
        self.running.remove(request)
        self.resources.release(request)
        request.status = RequestStatus.WAITING
        request.prefill_len = request.num_tokens
        request.num_computed_tokens = 0
        request.is_parked = request.is_preempting = False
        request.metrics.num_preemptions += 1
        self.waiting.appendleft(request)

    def mark_parked(self, slots: tuple[int, ...]) -> None:
        for slot in slots:
            request = self.resources.owner(slot)
            if request is not None:
                request.is_parked = True

    # ---- the step plan ----

    def schedule(self) -> StepPlan:
        plan = StepPlan(step=self._step)
        self._step += 1
        plan.preempt_tasks.extend(self._pending_preempts)
        self._pending_preempts.clear()
        self._resume_parked(plan)
        budget = self.token_budget - self._top_up_decoders(plan)
        budget = self._continue_prefills(plan, budget)
        self._admit_waiting(plan, budget)
        if self._is_stalled(plan):
            self._preempt_newest(plan)
        return plan

    def _decoding(self) -> list[Request]:
        return [r for r in self.running if not r.is_prefilling and not r.is_parked and not r.is_preempting]

    def _resume_parked(self, plan: StepPlan) -> None:
        """recover_decode_task resumes a slot once the block of position dec + 2K + 1 exists (OPS §5.5)."""
        for request in self.running:
            if not request.is_parked or request.is_preempting:
                continue
            needed = request.num_decoded_positions + 2 * self.k + 2
            if self.resources.grow_blocks(request, needed + self.k + 1) or \
                    self.resources.grow_blocks(request, needed):
                request.is_parked = False
                plan.block_table_tasks.append(BlockTableTask(request.slot, tuple(request.block_ids)))

    def _top_up_decoders(self, plan: StepPlan) -> int:
        """Keep each decoding slot ahead of the lookahead block speculate_schedule_cache checks after the next
        round (dec + K + 1 + 2K + 2); when the pool is short the runner parks the slot instead. Returns the
        decode tokens this step will feed."""
        decoding = self._decoding()
        for request in decoding:
            before = len(request.block_ids)
            if self.resources.grow_blocks(request, request.num_decoded_positions + 3 * self.k + 4) \
                    and len(request.block_ids) != before:
                plan.block_table_tasks.append(BlockTableTask(request.slot, tuple(request.block_ids)))
        return len(decoding) * (self.k + 1)

    def _prefill_task(self, request: Request, budget: int) -> PrefillTask | None:
        start = request.num_computed_tokens
        end = start + min(request.prefill_len - start, budget)
        lookahead = self.first_round_lookahead if end == request.prefill_len else 0
        if not (self.resources.grow_blocks(request, end + lookahead) or self.resources.grow_blocks(request, end)):
            return None
        request.num_computed_tokens = end
        return PrefillTask(slot=request.slot, start=start, end=end, prefill_len=request.prefill_len,
                           token_ids=tuple(request.known_token_ids) if start == 0 else (),
                           output_token_ids=tuple(request.output_token_ids),
                           block_ids=tuple(request.block_ids), sampling=self._sampling(request))

    def _continue_prefills(self, plan: StepPlan, budget: int) -> int:
        for request in self.running:
            if budget <= 0:
                break
            if request.is_prefilling and not request.is_preempting:
                task = self._prefill_task(request, budget)
                if task is None:
                    break
                plan.prefill_tasks.append(task)
                budget -= task.end - task.start
        return budget

    def _admit_waiting(self, plan: StepPlan, budget: int) -> None:
        while self.waiting and budget > 0 and self.resources.can_allocate_slot():
            request = self.waiting[0]
            chunk_end = min(request.prefill_len, budget)
            if not self.resources.grow_blocks(request, chunk_end):
                break
            self.waiting.popleft()
            self.resources.allocate_slot(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self.running.sort(key=lambda r: r.arrival)
            task = self._prefill_task(request, budget)
            plan.prefill_tasks.append(task)
            budget -= task.end - task.start

    def _is_stalled(self, plan: StepPlan) -> bool:
        """Nothing can compute this step although requests are waiting for resources."""
        if plan.prefill_tasks or plan.decode_tasks or self._decoding():
            return False
        if any(r.is_preempting for r in self.running):
            return False
        return bool(self.running) and (bool(self.waiting) or any(r.is_parked or r.is_prefilling
                                                                 for r in self.running))

    def _preempt_newest(self, plan: StepPlan) -> None:
        victim = max(self.running, key=lambda r: r.arrival)
        victim.is_preempting = True
        plan.preempt_tasks.append(PreemptTask(victim.slot))

    def _sampling(self, request: Request) -> SlotSampling:
        params = request.params
        return SlotSampling(temperature=params.temperature, top_p=params.top_p, seed=request.seed,
                            min_tokens=params.min_tokens, max_tokens=params.max_tokens,
                            eos_token_ids=request.eos_token_ids, stop_seqs=request.stop_seqs)
