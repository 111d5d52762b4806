"""Block accounting under PD (docs/design.md §8): the resource manager owns every block, always.

A property test drives random sequences of paired and unpaired requests, aborts on either side, reused ids, steps
and deadline expiries through a P and a D over an in-process transport, with the one-sided (Mooncake) flow so that
D's quarantine is exercised: P writes straight into D's blocks through `MooncakeKVTransfer` over a loopback engine
that copies between the two caches of this process. Prompts often start with a shared prefix, so both prefix caches
hit (D's before it reserves: P then writes only the blocks after D's hit) and P's and D's cached blocks are shared,
evicted and reused, also while D keeps a request's blocks in quarantine. After every operation each side's blocks are free
(uncached, or cached and unreferenced) or referenced by requests holding a slot and transfers held under finished
requests' ids, reference count = number of holders, never both; once the work drains, every slot and block is free
and nothing is held.
"""
from __future__ import annotations

import ctypes

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastdeploy.engine.connector.decode import DecodeConnector
from fastdeploy.engine.connector.prefill import PrefillConnector
from fastdeploy.engine.engine import LLMEngine
from fastdeploy.entrypoints.pd_builder import with_role
from fastdeploy.model_executor.models import get_model
from fastdeploy.schema.request import RequestIdInUseError
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise import HandoffDeadlines, InProcessTransport
from fastdeploy.splitwise.mooncake import MooncakeKVTransfer
from fastdeploy.worker import make_runner
from fastdeploy.worker.kv_transfer import PromptKVPort
from tests.splitwise.fakes import FakeClock

from .harness import toy_config

DEADLINES = HandoffDeadlines(decode_allocation_s=4.0, kv_transfer_s=3.0, prefill_result_s=5.0, reservation_s=6.0)
IDS = [f"r{i}" for i in range(6)]          # few ids, so reuse is frequent
DRAIN_STEPS = 3000                         # turns a hang into a failure
SHARED_PREFIX = [101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113]   # blocks of 4: up to 3 full


class LoopbackEngine:
    """The MooncakeEngine surface MooncakeKVTransfer uses, for two caches in one process: a write is a memmove."""

    session_address = "127.0.0.1:1"

    def register(self, regions) -> None:
        """Nothing to register: both caches are this process's memory."""

    def submit_write(self, session, sources, destinations, lengths) -> int:
        for source, destination, length in zip(sources, destinations, lengths):
            ctypes.memmove(destination, source, length)
        return 1

    def wait(self, session, *batches, timeout_s: float | None = None) -> None:
        """Every write landed in submit_write."""

    def close(self) -> None:
        """Nothing is held."""


class Pair:
    """A P and a D on one FakeClock, each over its own runner and cache, joined by an InProcessTransport."""

    def __init__(self, model):
        self.clock = FakeClock()
        self.transport = InProcessTransport(clock=self.clock)
        config = toy_config(1, max_num_seqs=3, num_kv_blocks=24)
        self.prefill = self._engine(with_role(config, "prefill"), model, PrefillConnector)
        self.decode = self._engine(with_role(config, "decode"), model, DecodeConnector)

    def _engine(self, config, model, connector_class) -> LLMEngine:
        runner = make_runner(config, model)
        port = PromptKVPort(runner.kv, model.num_target_layers)
        connector = connector_class(self.transport, port, self.clock, DEADLINES,
                                    MooncakeKVTransfer(port, LoopbackEngine()))
        return LLMEngine(config, runner, model.eos_token_ids, model.vocab_size, connector, idle_poll_s=0.0)

    @property
    def engines(self) -> tuple[LLMEngine, LLMEngine]:
        return self.prefill, self.decode

    def check(self) -> None:
        for engine in self.engines:
            engine.resources.check_invariant()

    def step(self) -> None:
        self.prefill.step()
        self.decode.step(max_wait_s=0.0)
        self.check()

    def assert_all_back(self) -> None:
        """Every slot and block free on both sides, nothing held for a transfer."""
        for engine in self.engines:
            stats = engine.stats()
            assert (stats.free_slots, stats.free_kv_blocks, stats.held_kv_blocks) == \
                (stats.total_slots, stats.total_kv_blocks, 0), f"{engine.role}: {stats}"

    def drain(self) -> None:
        """Step until neither side has work; time moves so that every deadline can end what waits on it."""
        for i in range(DRAIN_STEPS):
            if not any(e.has_unfinished() for e in self.engines):
                return
            self.step()
            if i % 20 == 19:
                self.clock.advance(max(DEADLINES.prefill_result_s, DEADLINES.reservation_s) + 1)
        raise AssertionError(f"the pair did not drain in {DRAIN_STEPS} steps")


def _add(engine: LLMEngine, rid: str, prompt: list[int], max_tokens: int) -> None:
    try:
        engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens),
                           disaggregate_info={"request_id": rid})
    except RequestIdInUseError:           # an id still in use anywhere on this side is refused, nothing taken
        pass


OPERATIONS = st.one_of(
    st.tuples(st.sampled_from(["pair"] * 4 + ["decode_only", "prefill_only"]), st.sampled_from(IDS),
              st.integers(1, 14), st.integers(1, 6), st.sampled_from([0, 0, 4, 9, 13])),
    st.tuples(st.sampled_from(["abort_prefill", "abort_decode"]), st.sampled_from(IDS)),
    st.tuples(st.just("steps"), st.integers(1, 6)),
    st.tuples(st.just("steps"), st.integers(1, 6)),
    st.tuples(st.just("advance"), st.sampled_from(["decode_allocation_s", "kv_transfer_s", "prefill_result_s",
                                                   "reservation_s"])),
)

_MODEL = get_model("fd-toy")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPERATIONS, min_size=1, max_size=30), st.integers(0, 2 ** 16))
def test_every_block_is_in_one_place_after_every_step_and_all_come_back(operations, seed):
    """docs/design.md §8: every block free or referenced with the right count after every operation; after the
    drain, all free."""
    pair, rng = Pair(_MODEL), np.random.default_rng(seed)
    try:
        for op in operations:
            kind = op[0]
            if kind in ("pair", "decode_only", "prefill_only"):
                _, rid, length, max_tokens, shared = op
                prompt = [256, *SHARED_PREFIX[:shared], *rng.integers(32, 127, length).tolist()]
                if kind != "prefill_only":
                    _add(pair.decode, rid, prompt, max_tokens)
                if kind != "decode_only":
                    _add(pair.prefill, rid, prompt, max_tokens)
            elif kind in ("abort_prefill", "abort_decode"):
                (pair.prefill if kind == "abort_prefill" else pair.decode).abort(op[1], "aborted by the test")
            elif kind == "steps":
                for _ in range(op[1]):
                    pair.step()
            else:
                pair.clock.advance(getattr(DEADLINES, op[1]) + 0.5)
            pair.check()
        pair.drain()
        pair.assert_all_back()
    finally:
        for engine in pair.engines:
            engine.close()


def test_prefix_hits_share_blocks_and_every_block_comes_back():
    """Paired requests sharing a prefix, one after another, then two at once, one of them aborted on D while P
    computes it (D's quarantine, over shared blocks): P's and D's later prompts hit their caches (shared blocks,
    reference counts above 1 while two run), the accounting is whole after every step, and all comes back."""
    pair, rng = Pair(_MODEL), np.random.default_rng(3)
    try:
        prompts = [[256, *SHARED_PREFIX, *rng.integers(32, 127, 6).tolist()] for _ in range(4)]
        for i, prompt in enumerate(prompts[:2]):
            _add(pair.decode, f"s{i}", prompt, 3)
            _add(pair.prefill, f"s{i}", prompt, 3)
            pair.drain()
        for i, prompt in enumerate(prompts[2:], 2):
            _add(pair.decode, f"s{i}", prompt, 3)
            _add(pair.prefill, f"s{i}", prompt, 3)
        pair.step()
        pair.decode.abort("s3", "aborted by the test")
        pair.drain()
        for engine in (pair.prefill, pair.decode):
            counters = engine.resources.prefix_counters
            assert counters.requests == 4 and counters.hit_requests == 3, (engine.role, counters)
        sent = pair.prefill.pd_counters()
        assert sent["handoffs_sent"] >= 3 and sent["send_failed"] == 0, sent   # the one-sided writes landed
        assert pair.decode.stats().cached_kv_blocks > 0
        pair.assert_all_back()
    finally:
        for engine in pair.engines:
            engine.close()
