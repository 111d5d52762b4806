"""A one-sided (Mooncake) write that times out while the transfer engine still runs it (docs/design.md §8): the
hand-off fails at once, but P's source blocks stay held until the engine lets go of the batch, so no later
request's KV is written over them while the engine may still be reading them into D's blocks, and P sends D no
refusal, which would end D's quarantine of the blocks the batch writes into. Written from P's staging pool instead,
the blocks go back at once (the engine reads the slot, which stays taken until it lets go). Both ways P runs a
write: on the engine's thread (an in-process transport) and on the placing thread (an asynchronous one)."""
from __future__ import annotations

import threading
import time

import pytest

from fastdeploy.engine.connector.decode import DecodeConnector
from fastdeploy.engine.connector.prefill import PrefillConnector
from fastdeploy.engine.engine import LLMEngine
from fastdeploy.entrypoints.pd_builder import with_role
from fastdeploy.model_executor.models import get_model
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise import InProcessTransport
from fastdeploy.splitwise.mooncake import MooncakeKVTransfer, StagingPool, WritesStillRunning
from fastdeploy.worker import make_runner
from fastdeploy.worker.kv_transfer import PromptKVPort
from tests.splitwise.fakes import FakeClock

from .harness import toy_config
from .test_block_accounting import DEADLINES, LoopbackEngine

PROMPT = [256, *range(40, 60)]
MAX_STEPS = 5000   # turns a hang into a failure
STEPS = 50         # steps while the engine still holds the failed write


class RecordingTransport(InProcessTransport):
    """Records P's refusals (over ZeroMQ each one tells D to end the request's quarantine at once)."""

    def __init__(self, clock):
        super().__init__(clock=clock)
        self.refused: list[tuple[str, str]] = []

    def refuse(self, request_id: str, reason: str) -> None:
        self.refused.append((request_id, reason))
        super().refuse(request_id, reason)


class StillReadingEngine(LoopbackEngine):
    """The writes are submitted (and land), but the wait times out with the batch still in the engine's hands
    until the test sets `let_go`."""

    def __init__(self):
        self.let_go = threading.Event()

    def wait(self, session, *batches, timeout_s: float | None = None) -> None:
        raise WritesStillRunning(f"Mooncake transfer engine: the writes to {session} did not land within "
                                 f"{timeout_s:g} s", self.let_go)


def _engine(config, model, connector_class, transport, clock, engine, staged: bool = False) -> LLMEngine:
    runner = make_runner(config, model)
    port = PromptKVPort(runner.kv, model.num_target_layers)
    staging = StagingPool.sized_for(port, len(PROMPT)) if staged else None
    connector = connector_class(transport, port, clock, DEADLINES, MooncakeKVTransfer(port, engine, staging))
    return LLMEngine(config, runner, model.eos_token_ids, model.vocab_size, connector, idle_poll_s=0.0)


@pytest.mark.parametrize("staged", [False, True], ids=["in-place", "staged"])
@pytest.mark.parametrize("placing_thread", [False, True], ids=["inline", "placing-thread"])
def test_the_blocks_of_a_write_the_engine_still_runs_stay_held_until_it_lets_go(placing_thread, staged):
    model, clock = get_model("fd-toy"), FakeClock()
    transport = RecordingTransport(clock)
    transport.streams_kv = placing_thread   # an asynchronous transport runs the write off the engine's thread
    config = toy_config(1, max_num_seqs=2, num_kv_blocks=24)
    stuck = StillReadingEngine()
    prefill = _engine(with_role(config, "prefill"), model, PrefillConnector, transport, clock, stuck, staged)
    decode = _engine(with_role(config, "decode"), model, DecodeConnector, transport, clock, LoopbackEngine())
    try:
        params = SamplingParams(max_tokens=4, min_tokens=4)
        decode.add_request("r", PROMPT, params, disaggregate_info={"request_id": "r"})
        prefill.add_request("r", PROMPT, params, disaggregate_info={"request_id": "r"})
        ended = []
        for _ in range(MAX_STEPS):   # until the write has failed (on the placing thread, in its own time)
            ended += prefill.step()
            decode.step(max_wait_s=0.0)
            prefill.resources.check_invariant()
            if prefill.pd_counters()["send_failed"]:
                break
            time.sleep(0.001)
        for _ in range(STEPS):       # and a while after: nothing gives the blocks back
            prefill.step()
            decode.step(max_wait_s=0.0)
        [request] = [r for r in ended if r.request_id == "r"]
        if placing_thread:   # the write failed after P's part ended: D fails the request at its deadline
            assert request.finish_reason == "handed_off"
        else:                # the write failed inside P's part: the request fails on P, with the reason
            assert request.finish_reason == "abort" and "did not land" in request.error, request.error
        assert prefill.pd_counters()["send_failed"] == 1
        stats = prefill.stats()
        assert stats.free_slots == stats.total_slots                     # only the blocks, not the slot
        if staged:   # the engine reads the staging slot: the blocks are back, the slot stays taken
            assert (stats.free_kv_blocks, stats.held_kv_blocks) == (stats.total_kv_blocks, 0), stats
            assert prefill.pd_counters()["staged_writes"] == 1
        else:
            assert stats.held_kv_blocks > 0, stats                        # still held for the engine
            assert "timed-out writes the transfer engine still runs ['r']" in prefill.connector.describe_held()
            assert prefill.has_unfinished()
        assert transport.refused == []   # a refusal would end D's quarantine of the blocks the batch writes

        stuck.let_go.set()
        prefill.step()
        assert prefill.pd_counters()["staged_writes"] == 0
        stats = prefill.stats()
        assert (stats.free_kv_blocks, stats.held_kv_blocks) == (stats.total_kv_blocks, 0), stats
        assert not prefill.has_unfinished()
        # D fails the request at its own deadline and gives its blocks back
        for _ in range(20):
            if not decode.has_unfinished():
                break
            clock.advance(DEADLINES.prefill_result_s + 1)
            decode.step(max_wait_s=0.0)
        stats = decode.stats()
        assert (stats.free_kv_blocks, stats.held_kv_blocks) == (stats.total_kv_blocks, 0), stats
    finally:
        prefill.close()
        decode.close()
