"""Builds the PD instances (PD_MTP_FLOW §1): a prefill or a decode instance over a model and a transport, and the
in-process pair joined by an InProcessTransport (docs/design.md §6, "PD")."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from fastdeploy.config import FDConfig
from fastdeploy.engine.engine import StepTrace
from fastdeploy.engine.pd import PDEngine
from fastdeploy.engine.pd_connector import IDLE_POLL_S
from fastdeploy.engine.pd_decode import DecodeInstance
from fastdeploy.engine.pd_prefill import PrefillInstance
from fastdeploy.model_executor.models import Model
from fastdeploy.output.prefill_token_processor import PrefillTokenProcessor
from fastdeploy.output.token_processor import TokenProcessor
from fastdeploy.splitwise import Clock, HandoffDeadlines, HandoffTransport, InProcessTransport, MonotonicClock
from fastdeploy.worker import make_runner
from fastdeploy.worker.kv_transfer import PromptKVPort

TraceHook = Callable[[StepTrace], None]


def _role_config(config: FDConfig, role: str) -> FDConfig:
    return replace(config, role=role, cache=replace(config.cache), scheduler=replace(config.scheduler))


def build_prefill_instance(config: FDConfig, model: Model, transport: HandoffTransport, clock: Clock | None = None,
                           deadlines: HandoffDeadlines | None = None, trace_hook: TraceHook | None = None,
                           idle_poll_s: float = IDLE_POLL_S) -> PrefillInstance:
    """P over its own runner, KV cache, slots and blocks (`config` with the role set to prefill)."""
    config = _role_config(config, "prefill")
    runner = make_runner(config, model)
    return PrefillInstance(config, runner, model.eos_token_ids, model.vocab_size, PrefillTokenProcessor,
                           PromptKVPort(runner.kv, model.num_target_layers), transport, clock=clock,
                           deadlines=deadlines, trace_hook=trace_hook, idle_poll_s=idle_poll_s)


def build_decode_instance(config: FDConfig, model: Model, transport: HandoffTransport, clock: Clock | None = None,
                          deadlines: HandoffDeadlines | None = None,
                          trace_hook: TraceHook | None = None) -> DecodeInstance:
    """D over its own runner, KV cache, slots and blocks (`config` with the role set to decode)."""
    config = _role_config(config, "decode")
    runner = make_runner(config, model)
    return DecodeInstance(config, runner, model.eos_token_ids, model.vocab_size, TokenProcessor,
                          PromptKVPort(runner.kv, model.num_target_layers), transport, clock=clock,
                          deadlines=deadlines, trace_hook=trace_hook)


def build_pd_engine(config: FDConfig, model: Model, clock: Clock | None = None,
                    deadlines: HandoffDeadlines | None = None, transport_capacity: int = 64,
                    prefill_trace_hook: TraceHook | None = None,
                    decode_trace_hook: TraceHook | None = None) -> PDEngine:
    """Both instances in this process, from one config and one model object."""
    clock = clock if clock is not None else MonotonicClock()
    transport = InProcessTransport(capacity=transport_capacity, clock=clock)
    # P never waits when idle here: D steps in the same thread right after it (and D waits when both are idle).
    return PDEngine(build_prefill_instance(config, model, transport, clock, deadlines, prefill_trace_hook,
                                           idle_poll_s=0.0),
                    build_decode_instance(config, model, transport, clock, deadlines, decode_trace_hook),
                    transport)
