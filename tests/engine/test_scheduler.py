"""Scheduler and resource manager (PD_MTP_FLOW §4.1, §7): chunked prefill, the single release
path, resuming parked slots, preemption only when nothing can run."""
from __future__ import annotations

from fastdeploy.schema.request import RequestStatus

from .helpers import add_request, make_config, make_engine_parts


def test_long_prompt_is_prefilled_in_chunks_under_the_token_budget():
    """PD_MTP_FLOW §4.1: chunk i covers [start, end), the first chunk carries the known tokens, later ones none."""
    scheduler, _ = make_engine_parts(make_config(k=1, budget=8))
    request = add_request(scheduler, "0", prompt_len=20)
    chunks = []
    while request.is_prefilling:
        (task,) = scheduler.schedule().prefill_tasks
        chunks.append((task.start, task.end, len(task.token_ids)))
    assert chunks == [(0, 8, 20), (8, 16, 0), (16, 20, 0)]


def test_release_returns_slot_and_every_block():
    """One function frees a slot and its KV blocks; liveness counts them before and after."""
    scheduler, resources = make_engine_parts(make_config())
    before = resources.stats()
    request = add_request(scheduler, "0", prompt_len=9)
    scheduler.schedule()
    assert request.slot == 0 and request.block_ids
    scheduler.finish(request, "stop")
    assert request.status is RequestStatus.FINISHED and resources.stats() == before


def test_block_growth_is_all_or_nothing():
    scheduler, resources = make_engine_parts(make_config(blocks=5))
    request = add_request(scheduler, "0", prompt_len=2)
    assert not resources.grow_blocks(request, 6 * 4)
    assert request.block_ids == [] and resources.num_free_blocks == 5
    assert resources.grow_blocks(request, 5 * 4) and resources.num_free_blocks == 0


def test_parked_request_is_resumed_by_a_block_table_refresh():
    """PD_MTP_FLOW §7.1: once blocks for dec + 2K + 1 are available the engine refreshes the slot's block table."""
    scheduler, resources = make_engine_parts(make_config(k=1))
    request = add_request(scheduler, "0", prompt_len=5)
    scheduler.schedule()
    request.output_token_ids.append(65)
    scheduler.update_from_output([], (request.slot,))
    plan = scheduler.schedule()
    assert [t.slot for t in plan.block_table_tasks][:1] == [request.slot] and not request.is_parked
    needed = resources.num_blocks_for(request.num_decoded_positions + 2 * 1 + 2)
    assert len(plan.block_table_tasks[0].block_ids) >= needed


def test_preemption_happens_only_when_nothing_can_run():
    """PD_MTP_FLOW §7.2: a parked request that cannot get blocks while another waits makes the step stall; the newest
    running request is preempted, once, and stays in its slot until the runner reports -9."""
    scheduler, resources = make_engine_parts(make_config(k=1, blocks=6))
    old = add_request(scheduler, "0", prompt_len=8)
    new = add_request(scheduler, "1", prompt_len=8)
    scheduler.schedule()
    old.output_token_ids.extend([65] * 6)   # dec 13: resuming needs 5 blocks, it holds 4
    new.output_token_ids.append(65)         # dec 8: resuming needs 3 blocks, it holds 2
    assert resources.num_free_blocks == 0
    plan = scheduler.schedule()
    assert plan.preempt_tasks == [] and not plan.prefill_tasks
    scheduler.update_from_output([], (old.slot, new.slot))
    plan = scheduler.schedule()
    assert [t.slot for t in plan.preempt_tasks] == [new.slot] and new.is_preempting
    assert new.slot is not None and new.block_ids
    assert scheduler.schedule().preempt_tasks == []
