"""Decides, each step, which requests compute which tokens, and what each step's outputs do to them.

There is no prefill phase and no decode phase here, only requests whose KV must catch up with their known tokens
(`num_computed_tokens` towards `prefill_len`, in chunks under a token budget) and requests that decode one round
per step. Every decision reduces to: which request gets a slot, which gets KV blocks, and, when nothing at all can
run, which request is preempted (the newest, recomputed later from its prompt and outputs; PD_MTP_FLOW §7.2).
The scheduler never touches a tensor; the runner parks slots it cannot feed, and the scheduler resumes them.
With prefix caching a local prefill starts past the cached blocks its prompt begins with, and the blocks a step
computed are named in the cache once their KV is exact (PD_MTP_FLOW §13).

A request's life has one path for every role: `add_request` (after the connector admitted it), then waiting —
or waiting for the peer under PD — then running, then `finish`, the only place a request's status, finish reason
and resources are settled (the connector is told, and may keep the blocks). The KV connector's roles only add
the peer's part: on P a request waits for D's reservation and its first token ends it ("handed_off"); on D a
request takes its slot and blocks at reservation, waits for P's hand-off, and starts with a first decode round.
"""
from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from fastdeploy.config import FDConfig, decode_lookahead, first_round_lookahead, resume_lookahead
from fastdeploy.engine.connector.base import KVConnector
from fastdeploy.engine.resource_manager import ResourceManager
from fastdeploy.schema.request import (FINISH_ABORT, FINISH_HANDED_OFF, FINISH_LENGTH, FINISH_STOP, Request,
                                       RequestStatus, TokenLogprob)
from fastdeploy.schema.step_io import (BlockTableTask, DecodeTask, PrefillTask, PreemptTask, SlotEvent, SlotReport,
                                       SlotSampling, StepPlan)

# What admitting a request for its peer came to (`_reserve_for_peer`)
_RESERVED, _NO_BLOCKS, _PEER_FULL = "reserved", "no blocks", "peer full"

class Scheduler:
    def __init__(self, config: FDConfig, resources: ResourceManager, connector: KVConnector):
        self.k = config.num_speculative_tokens
        self.token_budget = config.scheduler.max_num_batched_tokens
        # positions a decoding slot is kept ahead by: under async scheduling a plan is made before the previous
        # step's round is known, so one more round's worth (at most the block table's width)
        self.decode_lookahead = decode_lookahead(self.k) + (self.k + 1 if config.scheduler.async_scheduling else 0)
        self.max_positions = config.blocks_per_seq * config.cache.block_size
        self.resources = resources
        self.connector = connector
        self.report_cached_tokens = config.report_cached_tokens
        self.waiting: deque[Request] = deque()
        self.peer_waiting: dict[str, Request] = {}   # WAITING_FOR_PEER, in arrival order
        self.prefilled: deque[Request] = deque()     # D: hand-off in, slot held, first round not yet scheduled
        self.running: list[Request] = []             # in arrival order
        self.anomalies: list[str] = []               # tokens a step reported after a request's finishing token
        self.num_progress = 0                        # tokens emitted + requests finished (engine/watchdog.py)
        self._finished: list[Request] = []           # since the last take_finished()
        self._step = 0
        self._pending_preempts: list[PreemptTask] = []   # abort() of running requests, sent with the next plan
        self._last_plan = StepPlan(step=-1)          # what update_from_output applies an output to by default
        self._seed_source = random.SystemRandom()

    # ---- the request lifecycle ----

    def add_request(self, request: Request, status: RequestStatus) -> None:
        """Queue an admitted request, in the status its connector chose (WAITING or WAITING_FOR_PEER)."""
        seed = request.params.seed
        request.seed = self._seed_source.randrange(2 ** 31) if seed is None else seed
        request.prefill_len = request.num_tokens
        request.status = status
        if status is RequestStatus.WAITING_FOR_PEER:
            self.peer_waiting[request.request_id] = request
        else:
            self.waiting.append(request)

    def release_to_waiting(self, request: Request) -> None:
        """P: D's reservation for the request came; it may be computed now."""
        del self.peer_waiting[request.request_id]
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def on_prefilled(self, request: Request, t0: int, draft_token_ids: tuple[int, ...], seed: int,
                     t0_logprob: TokenLogprob | None = None) -> None:
        """D: P's KV is in the request's blocks, and the hand-off matched D's own request (the connector checked its
        prompt and sampling values). It decodes from its first round on with D's validated values, and with P's
        seed when the client gave none (so a sampled continuation is the one P's seed starts, docs/design.md §8);
        its outputs start with t0 (and its logprobs with P's for t0, when the request asks for them)."""
        del self.peer_waiting[request.request_id]
        if request.params.seed is None:
            request.seed = seed
        request.output_token_ids = [t0]
        request.output_logprobs = [t0_logprob] if t0_logprob is not None else []
        request.first_round_drafts = tuple(draft_token_ids)
        request.remote_prefill = False          # a preemption from now on recomputes locally (PD_MTP_FLOW §12.2)
        request.prefill_len = request.num_computed_tokens = len(request.prompt_token_ids)
        request.status = RequestStatus.RUNNING
        if self.k == 0 or len(draft_token_ids) > 1:   # d1 drafted: P's MTP KV covers the whole prompt
            self.resources.cache_computed_blocks(request, request.prefill_len)
        self.prefilled.append(request)

    def finish(self, request: Request, reason: str, error: str | None = None) -> None:
        """The one way a request ends: status and reason set, taken out of its queue, the connector told, then its
        slot freed and its blocks freed too, or kept under its id while the connector's transfer needs them
        (PD_MTP_FLOW §6)."""
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.error = error
        self._forget(request)
        keep_blocks = self.connector.request_finished(request)
        self.resources.release(request, keep_blocks=keep_blocks)
        self.num_progress += 1
        self._finished.append(request)

    def take_finished(self) -> list[Request]:
        """The requests finished since the previous call."""
        finished, self._finished = self._finished, []
        return finished

    def abort(self, request: Request, error: str | None = None) -> bool:
        """Stop a live request. One the runner has not seen is finished at once; a running one is preempted
        through the normal path (PreemptTask, then the -9 report), and finished with "abort" in the step that
        reports -9. False if the request is finished or already aborting."""
        if request.status is RequestStatus.FINISHED or request.is_aborting:
            return False
        error = error or "aborted"
        if request not in self.running:
            self.finish(request, FINISH_ABORT, error)
            return True
        request.error = error
        request.is_aborting = True
        if not request.is_preempting:   # a preemption already in flight reports -9 anyway
            request.is_preempting = True
            self._pending_preempts.append(PreemptTask(request.slot))
        return True

    def find(self, request_id: str) -> Request | None:
        """The live request with this id, wherever it is."""
        request = self.peer_waiting.get(request_id)
        if request is not None:
            return request
        for request in (*self.running, *self.prefilled, *self.waiting):
            if request.request_id == request_id:
                return request
        return None

    def has_unfinished(self) -> bool:
        return bool(self.has_local_work() or self.peer_waiting or self._finished)

    def has_local_work(self) -> bool:
        """Something this instance can compute or allocate without the peer: running requests, received hand-offs,
        a request to prefill, or (D) a reservation to make that no peer-held request stands in front of."""
        if self.running or self.prefilled:
            return True
        return any(not r.remote_prefill for r in self.waiting) or bool(self.waiting and not self.peer_waiting)

    def num_waiting(self) -> int:
        """Requests without a running slot yet: queued, held for the peer, or received and awaiting a round."""
        return len(self.waiting) + len(self.peer_waiting) + len(self.prefilled)

    def _forget(self, request: Request) -> None:
        if self.peer_waiting.pop(request.request_id, None) is not None:
            return
        for queue in (self.running, self.prefilled, self.waiting):
            if request in queue:
                queue.remove(request)
                return

    # ---- what a step's outputs do ----

    def update_from_output(self, reports: list[SlotReport], parked_slots: tuple[int, ...],
                           plan: StepPlan | None = None,
                           owner: Callable[[int], Request | None] | None = None) -> list[Request]:
        """Apply the token processor's per-slot reports (PD_MTP_FLOW §6), in slot order, then mark the slots the
        runner parked. `plan` is the plan the output computed (default: the last one `schedule` made) and `owner`
        the slot -> request lookup when that plan was made (default: the slots' owners now); under async
        scheduling the next plan is made before this output is applied (docs/design.md §10), so both differ from
        the defaults. Returns the requests these outputs finished."""
        first = len(self._finished)
        plan = self._last_plan if plan is None else plan
        owner = self.resources.owner if owner is None else owner
        completing = {}
        for task in plan.prefill_tasks:   # the chunks this output computed, by the request that computed them
            request = owner(task.slot)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue
            if task.end == task.prefill_len:
                completing[request] = task.start
            else:   # an intermediate chunk: its target and MTP KV is in the blocks now
                self.resources.cache_computed_blocks(request, task.end)
        for report in reports:
            request = owner(report.slot)
            if report.event is SlotEvent.PREEMPTED:
                if request.is_aborting:
                    self.finish(request, FINISH_ABORT, request.error)
                else:
                    self._requeue_preempted(request)
            elif report.event is SlotEvent.RECOVERY_STOP:
                self.finish(request, FINISH_ABORT, "stopped by the recovery path")
            else:
                self._record_round(request, report)
                reason = self._append_tokens(request, report)
                if request in completing:
                    self._cache_final_chunk(request, report, reason, completing[request])
                if reason is not None:
                    self.finish(request, reason)
        for slot in parked_slots:
            request = owner(slot)
            if request is not None and request.status is RequestStatus.RUNNING:
                request.is_parked = True
        return self._finished[first:]

    def _append_tokens(self, request: Request, report: SlotReport) -> str | None:
        """Append in order; returns the finish reason of the first token that ends the request. On P the first
        token always does: D decodes the rest (PD_MTP_FLOW §4.4)."""
        tokens = report.token_ids
        if request.remote_decode:
            request.output_token_ids.append(tokens[0])
            request.output_logprobs.extend(report.logprobs[:1])
            request.first_round_drafts = tokens[:1] + ((report.first_draft,) if report.first_draft >= 0 else ())
            self.num_progress += 1
            return FINISH_HANDED_OFF
        outputs, eos = request.output_token_ids, request.eos_token_ids
        room = request.params.max_tokens - len(outputs)   # tokens before the one that reaches max_tokens
        for i, token in enumerate(tokens):
            reason = FINISH_STOP if token in eos else (FINISH_LENGTH if i + 1 >= room else None)
            if reason is not None:
                self._append(request, tokens, i + 1, report.logprobs)
                if i + 1 < len(tokens):
                    self.anomalies.append(f"request {request.request_id}: tokens {list(tokens[i + 1:])} after its "
                                          f"finishing token were dropped")
                return reason
        self._append(request, tokens, len(tokens), report.logprobs)
        return None

    def _append(self, request: Request, tokens: tuple[int, ...], n: int, logprobs: tuple) -> None:
        request.output_token_ids.extend(tokens[:n])
        request.output_logprobs.extend(logprobs[:n])
        self.num_progress += n

    def _cache_final_chunk(self, request: Request, report: SlotReport, reason: str | None,
                           chunk_start: int) -> None:
        """The step computed the prompt's last chunk. With MTP its MTP KV is written only when t0 did not stop the
        slot (the proposer skips stopped slots): on P when d1 was drafted, elsewhere when the request goes on;
        otherwise only the earlier chunks' blocks are exact."""
        mtp_ran = self.k == 0 or (report.first_draft >= 0 if request.remote_decode else reason is None)
        self.resources.cache_computed_blocks(request, request.prefill_len if mtp_ran else chunk_start)

    @staticmethod
    def _record_round(request: Request, report: SlotReport) -> None:
        if report.num_drafts < 0:
            return
        metrics = request.metrics
        metrics.num_decode_rounds += 1
        metrics.num_draft_tokens += report.num_drafts
        metrics.num_accepted_drafts += len(report.token_ids) - 1
        metrics.accepted_per_round.append(len(report.token_ids))

    def _requeue_preempted(self, request: Request) -> None:
        """The runner acknowledged the preemption (-9): free everything, recompute prompt + outputs later."""
        self.running.remove(request)
        self.resources.release(request)
        request.status = RequestStatus.WAITING
        request.prefill_len = request.num_tokens
        request.num_computed_tokens = 0
        request.is_parked = request.is_preempting = False
        request.metrics.num_preemptions += 1
        self.waiting.appendleft(request)

    # ---- the step plan ----

    def schedule(self) -> StepPlan:
        plan = self._last_plan = StepPlan(step=self._step)
        self._step += 1
        plan.preempt_tasks.extend(self._pending_preempts)
        self._pending_preempts.clear()
        self._resume_parked(plan)
        self._insert_prefilled(plan)
        budget = self.token_budget - self._top_up_decoders(plan)
        budget = self._continue_prefills(plan, budget)
        self._admit_waiting(plan, budget)
        if self._is_stalled(plan):
            self._preempt_newest(plan)
        return plan

    def _decoding(self) -> list[Request]:
        return [r for r in self.running if _is_decoding(r)]

    def _start_running(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self.running.sort(key=lambda r: r.arrival)

    def _resume_parked(self, plan: StepPlan) -> None:
        """recover_decode_task resumes a slot once the block of position dec + 2K + 1 exists (OPS §5.5)."""
        for request in self.running:
            if not request.is_parked or request.is_preempting:
                continue
            needed = request.num_decoded_positions + resume_lookahead(self.k)
            if self.resources.grow_blocks(request, needed + self.k + 1) or \
                    self.resources.grow_blocks(request, needed):
                request.is_parked = False
                plan.block_table_tasks.append(BlockTableTask(request.slot, tuple(request.block_ids)))

    def _insert_prefilled(self, plan: StepPlan) -> None:
        """D: received hand-offs start their first round (PD_MTP_FLOW §5.3) while the round's K + 1 tokens fit in
        the budget beside the decoders (always when nothing else runs)."""
        if not self.prefilled:
            return
        budget = self.token_budget - len(self._decoding()) * (self.k + 1)
        while self.prefilled and (budget >= self.k + 1 or not self.running):
            request = self.prefilled.popleft()
            self._start_running(request)
            plan.decode_tasks.append(DecodeTask(slot=request.slot, prompt_len=len(request.prompt_token_ids),
                                                draft_token_ids=request.first_round_drafts,
                                                block_ids=tuple(request.block_ids), sampling=self._sampling(request)))
            budget -= self.k + 1

    def _top_up_decoders(self, plan: StepPlan) -> int:
        """Keep each decoding slot ahead of the lookahead block speculate_schedule_cache checks after the next
        round; when the pool is short the runner parks the slot instead. Returns the decode tokens this step will
        feed."""
        decoding = self._decoding()
        # the positions a slot's blocks cover now: a slot that needs no new block skips grow_blocks (it would
        # allocate nothing)
        lookahead, block_size, most = self.decode_lookahead, self.resources.block_size, self.max_positions
        for request in decoding:
            before = len(request.block_ids)
            # num_decoded_positions, without its two property calls
            needed = min(len(request.prompt_token_ids) + len(request.output_token_ids) - 1 + lookahead, most)
            if needed <= before * block_size:
                continue
            if self.resources.grow_blocks(request, needed) and len(request.block_ids) != before:
                plan.block_table_tasks.append(BlockTableTask(request.slot, tuple(request.block_ids)))
        return len(decoding) * (self.k + 1)

    def _prefill_task(self, request: Request, budget: int, first_chunk: bool = False) -> PrefillTask | None:
        start = request.num_computed_tokens
        end = start + min(request.prefill_len - start, budget)
        lookahead = first_round_lookahead(self.k) if end == request.prefill_len else 0
        if not (self.resources.grow_blocks(request, end + lookahead) or self.resources.grow_blocks(request, end)):
            return None
        request.num_computed_tokens = end
        return PrefillTask(slot=request.slot, start=start, end=end, prefill_len=request.prefill_len,
                           token_ids=tuple(request.known_token_ids) if first_chunk else (),
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
        """FIFO: the oldest waiting request first. A request whose prompt P computes takes its slot and the
        blocks of positions 0..L + 2K + 2 (PD_MTP_FLOW §5.1: D's first round has no stage 10 before it and its
        MTP chain writes up to position L + K, so the slot must hold what row Park demands of every decoding
        slot) and waits for the peer; any other request starts its prefill under the token budget. A request whose
        peer cannot be told now (not connected, or its queue is full) waits without a slot, with every later one
        for that peer (FIFO per peer), while the requests of every other peer are admitted behind it. The queue is
        walked from its head only (a deque's middle costs O(n) to reach), the skipped requests put back in order,
        so a step costs O(waiting) however many wait for a blocked peer."""
        blocked_peers, skipped = set(), []
        while self.waiting and self.resources.can_allocate_slot():
            request = self.waiting[0]
            if request.remote_prefill:
                peer = self.connector.peer_key(request)
                if peer in blocked_peers or not self.connector.peer_ready(request):
                    blocked_peers.add(peer)
                    skipped.append(self.waiting.popleft())
                    continue
                outcome = self._reserve_for_peer(request)
                if outcome is _NO_BLOCKS:
                    break
                if outcome is _PEER_FULL:
                    blocked_peers.add(peer)
                    skipped.append(self.waiting.popleft())
                continue
            if budget <= 0 or not self._take_prefix_and_blocks(request, budget):
                break
            self.waiting.popleft()
            self.resources.allocate_slot(request)
            self._start_running(request)
            task = self._prefill_task(request, budget, first_chunk=True)
            plan.prefill_tasks.append(task)
            budget -= task.end - task.start
        self.waiting.extendleft(reversed(skipped))

    def _take_prefix_and_blocks(self, request: Request, budget: int) -> bool:
        """The cached blocks of the request's prefix, then fresh blocks for its first chunk (all or nothing): its
        prefill starts at the first position no cached block holds. The first admission counts the lookup."""
        hit = self.resources.match_prefix(request)
        if not self.resources.grow_blocks(request, min(request.prefill_len, hit + budget)):
            self.resources.unmatch_prefix(request)
            return False
        request.num_computed_tokens = hit
        if self.resources.prefix_caching and request.metrics.num_preemptions == 0:
            request.num_cached_tokens = hit if self.report_cached_tokens else 0
            self.resources.count_lookup(len(request.prompt_token_ids), hit)
        return True

    def _reserve_for_peer(self, request: Request) -> str:
        """D's prefix cache first: the request shares the cached blocks of its prompt's longest cached prefix, its
        `num_computed_tokens` says how many positions they hold, and P sends the KV of the rest only (PD_MTP_FLOW
        §13.6); then the blocks of the other positions, the slot, and the reservation."""
        hit = self.resources.match_prefix(request)
        length = len(request.prompt_token_ids) + first_round_lookahead(self.k)
        if not self.resources.grow_blocks(request, length):
            self.resources.unmatch_prefix(request)
            return _NO_BLOCKS
        request.num_computed_tokens = hit
        self.resources.allocate_slot(request)
        if not self.connector.on_allocated(request):
            self.resources.release(request)
            request.num_computed_tokens = 0
            return _PEER_FULL
        if self.resources.prefix_caching:
            request.num_cached_tokens = hit if self.report_cached_tokens else 0
            self.resources.count_lookup(len(request.prompt_token_ids), hit)
        self.waiting.popleft()   # the head: `_admit_waiting` reserves only there
        request.status = RequestStatus.WAITING_FOR_PEER
        self.peer_waiting[request.request_id] = request
        return _RESERVED

    def _is_stalled(self, plan: StepPlan) -> bool:
        """Nothing can compute this step although requests are waiting for resources."""
        if plan.prefill_tasks or plan.decode_tasks or any(_is_decoding(r) for r in self.running):
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
                            eos_token_ids=request.eos_token_ids, stop_seqs=request.stop_seqs,
                            logprobs=params.logprobs, top_k=params.top_k, min_p=params.min_p,
                            repetition_penalty=params.repetition_penalty,
                            frequency_penalty=params.frequency_penalty, presence_penalty=params.presence_penalty,
                            prompt_token_ids=tuple(request.prompt_token_ids) if params.uses_penalties else ())


def _is_decoding(request: Request) -> bool:
    """Running a decode round this step: its prompt computed (not `is_prefilling`), neither parked nor preempted."""
    return request.num_computed_tokens >= request.prefill_len and not request.is_parked and \
        not request.is_preempting
