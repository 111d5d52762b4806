"""The rules of PD_MTP_FLOW §6 (invariant I5), driven by hand-built step messages: the token processor reads each
slot's entry, the scheduler finishes or requeues (one finish path)."""
from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.schema.request import RequestStatus
from fastdeploy.schema.step_io import RunnerOutput

from .helpers import EOS, StepOutputs, add_request, make_config, make_engine_parts, runner_output

T = 2  # K = 1


@pytest.fixture
def engine():
    """Two requests admitted into slots 0 and 1 (prefill done), slots 2 and 3 empty."""
    scheduler, resources = make_engine_parts(make_config(k=1))
    requests = [add_request(scheduler, "0", max_tokens=4), add_request(scheduler, "1", max_tokens=4)]
    scheduler.schedule()
    assert [r.slot for r in requests] == [0, 1]
    return scheduler, resources, StepOutputs(scheduler, resources), requests


def test_count_zero_is_the_only_skip(engine):
    """PD_MTP_FLOW §6 row `[]`: nothing happens; every other entry is processed."""
    _, _, processor, (a, b) = engine
    assert processor.apply(runner_output([[], [], [], []], T)) == []
    assert a.output_token_ids == [] and b.output_token_ids == []


def test_count_one_is_processed_whatever_the_token_value(engine):
    """I5 / PD_MTP_FLOW §8 fix (1): a reported token 0 (the lowest id) is appended, not treated as "no output"."""
    _, _, processor, (a, _) = engine
    processor.apply(runner_output([[0], [], [], []], T))
    assert a.output_token_ids == [0]


def test_eos_finishes_and_frees_slot_and_blocks_in_the_same_call(engine):
    """PD_MTP_FLOW §6 "Finishing": the slot and blocks are free before the next step (I1's engine half)."""
    scheduler, resources, processor, (a, b) = engine
    free_blocks = resources.num_free_blocks
    held = len(a.block_ids)
    finished = processor.apply(runner_output([[65, EOS], [66], [], []], T, [1, 1, -1, -1]))
    assert finished == [a] and a.finish_reason == "stop" and a.status is RequestStatus.FINISHED
    assert a.slot is None and a.block_ids == [] and resources.owner(0) is None
    assert resources.num_free_blocks == free_blocks + held
    assert b.output_token_ids == [66] and b in scheduler.running


def test_max_tokens_finishes_with_length(engine):
    _, _, processor, (a, _) = engine
    processor.apply(runner_output([[65, 66], [], [], []], T))
    finished = processor.apply(runner_output([[67, 68], [], [], []], T))
    assert finished == [a] and a.finish_reason == "length" and a.output_token_ids == [65, 66, 67, 68]


def test_tokens_after_the_finishing_token_are_dropped_and_reported(engine):
    """PD_MTP_FLOW §6: tokens after the finishing token must not exist; if they do they are dropped and logged."""
    _, _, processor, (a, _) = engine
    processor.apply(runner_output([[EOS, 70], [], [], []], T))
    assert a.output_token_ids == [EOS]
    assert len(processor.anomalies) == 1


def test_preemption_report_frees_and_requeues_for_recomputation(engine):
    """PD_MTP_FLOW §6 row [-9] / PD_MTP_FLOW §7.2: blocks and slot are freed only on the report; the request is queued
    first with its outputs kept, to be recomputed as a prefill of prompt + outputs."""
    scheduler, resources, processor, (a, _) = engine
    processor.apply(runner_output([[65], [], [], []], T))
    processor.apply(runner_output([[-9], [], [], []], T))
    assert a.status is RequestStatus.WAITING and scheduler.waiting[0] is a
    assert a.slot is None and a.block_ids == [] and a.output_token_ids == [65]
    assert a.prefill_len == len(a.prompt_token_ids) + 1 and a.num_computed_tokens == 0
    assert a.metrics.num_preemptions == 1


def test_recovery_stop_aborts_the_request(engine):
    """PD_MTP_FLOW §6 row [-3]: finish with an abort reason; slot and blocks freed."""
    _, resources, processor, (_, b) = engine
    finished = processor.apply(runner_output([[], [-3], [], []], T))
    assert finished == [b] and b.finish_reason == "abort" and b.error
    assert resources.owner(1) is None


def test_entry_for_an_empty_slot_is_an_anomaly(engine):
    """PD_MTP_FLOW §6 row "no request in slot j": anything but [] is logged and ignored."""
    _, _, processor, _ = engine
    processor.apply(runner_output([[], [], [65], []], T))
    assert len(processor.anomalies) == 1


def test_empty_message_means_no_step(engine):
    """OPS §5.7: a length-0 message (stage 4 early exit) carries nothing."""
    _, _, processor, (a, _) = engine
    out = RunnerOutput(message=np.zeros(0, np.int64), draft_counts=np.full(4, -1, np.int32), parked_slots=())
    assert processor.apply(out) == [] and a.output_token_ids == []


def test_decode_round_metrics_count_drafts_and_accepted_tokens(engine):
    _, _, processor, (a, _) = engine
    processor.apply(runner_output([[65], [], [], []], T, [-1, -1, -1, -1]))     # t0 from the prefill step
    processor.apply(runner_output([[66, 67], [], [], []], T, [1, -1, -1, -1]))  # draft accepted + bonus
    processor.apply(runner_output([[68], [], [], []], T, [1, -1, -1, -1]))      # draft rejected
    m = a.metrics
    assert (m.num_decode_rounds, m.num_draft_tokens, m.num_accepted_drafts, m.accepted_per_round) == \
        (2, 2, 1, [2, 1])
