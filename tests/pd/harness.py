"""Running a workload on an in-process PD pair (fd-toy) and checking it against a single instance
(PD_MTP_FLOW §10): outputs, per-round acceptance, liveness with a no-progress watchdog, and a drained state."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from fastdeploy.config import CacheConfig, FDConfig, SchedulerConfig, SpeculativeConfig
from fastdeploy.engine.watchdog import Watchdog
from fastdeploy.entrypoints.local_router import LocalPDRouter
from fastdeploy.entrypoints.pd_builder import build_local_pd
from fastdeploy.model_executor.models import get_model
from fastdeploy.output.detokenizer import IncrementalDetokenizer
from fastdeploy.schema.request import Request
from fastdeploy.splitwise import HandoffDeadlines
from tests.e2e.trace_checks import TraceChecker
from tests.splitwise.fakes import FakeClock, FaultyTransport
from tests.e2e.workloads import TOY_ENGINE, Case, toy_workload

MAX_IDLE_STEPS = 60


@functools.lru_cache(maxsize=4)
def workload(seed: int) -> list[Case]:
    """tests/e2e's seeded workload, built once per seed for the whole PD suite (finding its prompts is slow)."""
    return toy_workload(seed)


def toy_config(k: int, **engine) -> FDConfig:
    """The e2e suite's fd-toy engine (small blocks, small token budget) with MTP K (0 = no speculation)."""
    opts = {**TOY_ENGINE, "num_kv_blocks": None, "runner": "xpu", "ops_backend": "cpu", **engine}
    unknown = set(opts) - {"model", "max_num_seqs", "block_size", "max_model_len", "max_num_batched_tokens",
                           "num_kv_blocks", "runner", "ops_backend"}
    assert not unknown, f"toy_config: unknown option(s) {sorted(unknown)}"
    spec = SpeculativeConfig("mtp", k) if k else SpeculativeConfig()
    return FDConfig(model="fd-toy", runner=opts["runner"], ops_backend=opts["ops_backend"], speculative=spec,
                    cache=CacheConfig(block_size=opts["block_size"], num_kv_blocks=opts["num_kv_blocks"]),
                    scheduler=SchedulerConfig(max_num_seqs=opts["max_num_seqs"], max_model_len=opts["max_model_len"],
                                              max_num_batched_tokens=opts["max_num_batched_tokens"]))


@dataclass
class PDRun:
    engine: LocalPDRouter                         # .prefill and .decode are the two LLMEngines
    requests: list[Request]                       # D's request objects, in case order
    decode_trace: TraceChecker
    prefill_trace: TraceChecker
    clock: FakeClock
    steps: int = 0
    decode_tasks: dict[str, int] = field(default_factory=dict)   # request id -> DecodeTasks issued on D
    parked: set[str] = field(default_factory=set)                # request ids D parked at least once


def start_pd(k: int, *, model_options: dict | None = None, deadlines: HandoffDeadlines | None = None,
             transport_capacity: int = 64, **engine) -> PDRun:
    """A PD pair on a FakeClock (the test drives time) over a FaultyTransport (tests inject faults through
    `run.engine.transport`); trace checkers (I1, I4, I6) on both instances."""
    clock = FakeClock()
    decode_trace, prefill_trace = TraceChecker(MAX_IDLE_STEPS), TraceChecker(MAX_IDLE_STEPS)
    run = PDRun(None, [], decode_trace, prefill_trace, clock)

    def on_decode_step(step):
        decode_trace(step)
        for task in step.plan.decode_tasks:
            rid = step.slot_owners[task.slot].request_id
            run.decode_tasks[rid] = run.decode_tasks.get(rid, 0) + 1
        run.parked.update(step.slot_owners[slot].request_id for slot in step.output.parked_slots)

    run.engine = build_local_pd(toy_config(k, **engine), get_model("fd-toy", **(model_options or {})),
                                clock=clock, deadlines=deadlines,
                                transport=FaultyTransport(capacity=transport_capacity, clock=clock),
                                prefill_trace_hook=prefill_trace, decode_trace_hook=on_decode_step)
    decode_trace.attach(run.engine.decode.runner)
    prefill_trace.attach(run.engine.prefill.runner)
    return run


def submit(run: PDRun, cases: list[Case]) -> None:
    tokenizer = run.engine.decode.runner.model.tokenizer
    for case in cases:
        stop_seqs = tuple(tuple(tokenizer.encode(s, add_special_tokens=False)) for s in case.params.stop)
        run.requests.append(run.engine.add_request(str(len(run.requests)), case.prompt, case.params, stop_seqs))


def drive(run: PDRun, tick_s: float = 0.0, max_idle_steps: int = MAX_IDLE_STEPS) -> None:
    """Step until nothing is unfinished. O3 watchdog (engine/watchdog.py): fails with AssertionError naming the
    stuck requests, never hangs, after `max_idle_steps` steps in a row in which no token was emitted and no request
    finished. `tick_s` advances the fake clock after each step (deadline tests); only then may steps that wait on
    the connector alone pass uncounted, since only then can a deadline end them."""
    watchdog = Watchdog(run.engine.engines, max_idle_steps, owner="O3 watchdog", allow_connector_waits=tick_s > 0)
    while run.engine.has_unfinished():
        run.engine.step()
        run.steps += 1
        run.clock.advance(tick_s)
        for engine in run.engine.engines:
            engine.resources.check_invariant()    # docs/design.md §8: every block in exactly one place
        try:
            watchdog.after_step()
        except RuntimeError as error:
            raise AssertionError(str(error)) from None


def run_pd(cases: list[Case], k: int, **options) -> PDRun:
    run = start_pd(k, **options)
    submit(run, cases)
    drive(run)
    assert_drained(run)
    return run


def assert_drained(run: PDRun) -> None:
    """O3 on P and D: every slot and block free, nothing running or waiting, no pending wait, no message or ack in
    the transport, and the token processors saw no anomaly."""
    pd = run.engine
    for name, instance in (("P", pd.prefill), ("D", pd.decode)):
        stats = instance.stats()
        assert (stats.free_slots, stats.free_kv_blocks, stats.running_requests) == \
            (stats.total_slots, stats.total_kv_blocks, 0), f"{name} resources not released: {stats}"
        assert not instance.has_unfinished(), f"{name} still has requests, reservations or held blocks"
        assert not instance.anomalies, f"{name}: {instance.anomalies}"
        assert len(instance.connector.waits) == 0, f"{name}: waits left pending"
    assert not pd.prefill.connector.describe_held(), "P holds hand-offs"
    for instance in (pd.prefill, pd.decode):
        assert instance.resources.num_held_blocks == 0
        instance.resources.check_invariant()
    assert pd.transport.num_in_flight() == 0 and pd.transport.num_pending_acks() == 0 \
        and pd.transport.num_pending_reservations() == 0, "transport not empty"


def assert_same_as_single(cases: list[Case], single: list, pd_requests: list[Request],
                          per_round: bool = True) -> None:
    """O1 (tokens and finish reason); with `per_round`, O2 (accepted tokens of every decode round)."""
    tokenizer = get_model("fd-toy").tokenizer
    for case, want, got in zip(cases, single, pd_requests):
        assert got.error is None, f"{case.name}: {got.error}"
        # LLM.generate emits up to a stop string's last token; the engine also wrote its end token after it
        stops = IncrementalDetokenizer(tokenizer, tuple(case.params.stop), False, got.prompt_token_ids,
                                       case.params.min_tokens)
        _, emitted = stops.push_until_stop(list(got.output_token_ids))
        assert (got.output_token_ids[:emitted], got.finish_reason) == \
            (want.outputs.token_ids, want.outputs.finish_reason), f"O1: {case.name}"
        if per_round:
            assert got.metrics.accepted_per_round == want.metrics.accepted_per_round, f"O2: {case.name}"
            assert got.metrics.num_draft_tokens == want.metrics.num_draft_tokens, f"O2: {case.name}"
