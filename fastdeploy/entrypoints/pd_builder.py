"""Builds a PD pair in one process (PD_MTP_FLOW §1): a prefill engine and a decode engine over the same model,
joined by an InProcessTransport (docs/design.md §4, "PD")."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from fastdeploy.config import FDConfig
from fastdeploy.engine.engine import LLMEngine, StepTrace
from fastdeploy.engine.pd import DecodeScheduler, PDEngine
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.model_executor.models import Model
from fastdeploy.output.prefill_token_processor import PrefillTokenProcessor
from fastdeploy.output.token_processor import TokenProcessor
from fastdeploy.splitwise import Clock, HandoffDeadlines, InProcessTransport, MonotonicClock
from fastdeploy.worker import make_runner
from fastdeploy.worker.kv_transfer import PromptKVPort


def build_pd_engine(config: FDConfig, model: Model, clock: Clock | None = None,
                    deadlines: HandoffDeadlines | None = None, transport_capacity: int = 64,
                    prefill_trace_hook: Callable[[StepTrace], None] | None = None,
                    decode_trace_hook: Callable[[StepTrace], None] | None = None) -> PDEngine:
    """P and D get `config` with their role set; each owns its runner, KV cache, slots and blocks."""
    clock = clock if clock is not None else MonotonicClock()
    engines, ports = {}, {}
    for role, make_processor, make_scheduler, hook in (
            ("prefill", PrefillTokenProcessor, Scheduler, prefill_trace_hook),
            ("decode", TokenProcessor, DecodeScheduler, decode_trace_hook)):
        role_config = replace(config, role=role, cache=replace(config.cache),
                              scheduler=replace(config.scheduler))
        runner = make_runner(role_config, model)
        engines[role] = LLMEngine(role_config, runner, model.eos_token_ids, model.vocab_size, make_processor,
                                  trace_hook=hook, make_scheduler=make_scheduler)
        ports[role] = PromptKVPort(runner.kv, model.num_target_layers)
    transport = InProcessTransport(capacity=transport_capacity, clock=clock)
    return PDEngine(engines["prefill"], engines["decode"], ports["prefill"], ports["decode"], transport,
                    clock=clock, deadlines=deadlines)
