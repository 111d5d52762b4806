"""D's scheduler: the single instance's, plus the PD queue of requests whose prompt another instance computes.

A PD request on D passes through `pending` (queued, holds nothing), `reserved` (holds the KV blocks of positions
0..L + 2K + 2, PD_MTP_FLOW §5.1, while P computes the prompt), `prefilled` (P's KV is in its blocks; waits for a
slot) and then the running set, where it is an ordinary request: parking, resuming, top-up and preemption are the
single instance's. A preempted request is recomputed locally as a prefill of prompt + outputs (PD_MTP_FLOW §7.2;
PD_MTP_FLOW §12.2). `finish` frees a request wherever it is in that queue.
"""
from __future__ import annotations

from dataclasses import replace

from fastdeploy.config import FDConfig
from fastdeploy.engine.request import Request, RequestStatus
from fastdeploy.engine.resource_manager import ResourceManager
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.step_io import DecodeTask, StepPlan
from fastdeploy.splitwise import HandoffSamplingParams


class DecodeScheduler(Scheduler):
    def __init__(self, config: FDConfig, resources: ResourceManager):
        super().__init__(config, resources)
        self.pending: dict[str, Request] = {}                                # FIFO (insertion order)
        self.reserved: dict[str, Request] = {}
        self.prefilled: dict[str, tuple[Request, tuple[int, ...]]] = {}      # FIFO, with draft_token_ids

    # ---- the PD queue ----

    def add_pending(self, request: Request) -> None:
        self.pending[request.request_id] = request

    def reserve_next(self) -> Request | None:
        """Reserve the oldest pending request's blocks (PD_MTP_FLOW §5.1, through L + 2K + 2: D's first round has no
        stage 10 before it and its MTP chain writes up to position L + K, so the slot must enter it holding what row
        Park demands of every decoding slot). At most B requests hold reservations, so D's pool is not hoarded. None
        when nothing is pending or the pool cannot cover the oldest request yet (FIFO)."""
        if not self.pending or len(self.reserved) + len(self.prefilled) >= self.resources.num_slots:
            return None
        request = next(iter(self.pending.values()))
        if not self.resources.grow_blocks(request, len(request.prompt_token_ids) + self.first_round_lookahead):
            return None
        del self.pending[request.request_id]
        self.reserved[request.request_id] = request
        return request

    def unreserve(self, request: Request) -> None:
        """Undo `reserve_next` (P could not be told): the blocks go back and the request is oldest again."""
        del self.reserved[request.request_id]
        self.resources.release(request)
        self.pending = {request.request_id: request, **self.pending}

    def add_prefilled(self, request: Request, t0: int, draft_token_ids: tuple[int, ...],
                      sampling: HandoffSamplingParams) -> None:
        """P's KV is in the request's blocks: queue it for a slot with exactly the sampling values P used
        (PD_MTP_FLOW §3)."""
        del self.reserved[request.request_id]
        request.params = replace(request.params, temperature=sampling.temperature, top_p=sampling.top_p,
                                 max_tokens=sampling.max_tokens, min_tokens=sampling.min_tokens, seed=sampling.seed)
        request.seed = sampling.seed
        request.eos_token_ids = sampling.eos_token_ids
        request.stop_seqs = sampling.stop_seqs
        request.output_token_ids = [t0]
        request.prefill_len = request.num_computed_tokens = len(request.prompt_token_ids)
        self.prefilled[request.request_id] = (request, draft_token_ids)

    def find_queued(self, request_id: str) -> Request | None:
        """The request under `request_id` if it is in the PD queue (not yet in a slot)."""
        for queue in (self.pending, self.reserved):
            if request_id in queue:
                return queue[request_id]
        entry = self.prefilled.get(request_id)
        return None if entry is None else entry[0]

    @property
    def num_waiting_on_peer(self) -> int:
        return len(self.pending) + len(self.reserved)

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or bool(self.prefilled)

    def _forget(self, request: Request) -> None:
        rid = request.request_id
        for queue in (self.pending, self.reserved, self.prefilled):
            if queue.pop(rid, None) is not None:
                return
        super()._forget(request)

    # ---- the step plan ----

    def _top_up_decoders(self, plan: StepPlan) -> int:
        # Inserted slots decode from this step on, so they are admitted before the decoders' budget is counted.
        self._admit_prefilled(plan)
        return super()._top_up_decoders(plan)

    def _admit_prefilled(self, plan: StepPlan) -> None:
        budget = self.token_budget - len(self._decoding()) * (self.k + 1)
        while self.prefilled and self.resources.can_allocate_slot() and (budget >= self.k + 1
                                                                          or not self.running):
            request, draft_token_ids = self.prefilled.pop(next(iter(self.prefilled)))
            self.resources.allocate_slot(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self.running.sort(key=lambda r: r.arrival)
            plan.decode_tasks.append(DecodeTask(slot=request.slot, prompt_len=len(request.prompt_token_ids),
                                                draft_token_ids=draft_token_ids,
                                                block_ids=tuple(request.block_ids), sampling=self._sampling(request)))
            budget -= self.k + 1
