"""Builds instances (PD_MTP_FLOW §1): one LLMEngine over a model, with the KV connector of its role, and the
in-process PD pair joined by an InProcessTransport (docs/design.md §6, "PD")."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from fastdeploy.precision import kv_storage_dtype, parse_quantization
from fastdeploy.config import FDConfig
from fastdeploy.engine.connector.base import IDLE_POLL_S, KVConnector, MixedConnector
from fastdeploy.engine.connector.decode import DecodeConnector
from fastdeploy.engine.connector.prefill import PrefillConnector
from fastdeploy.engine.engine import LLMEngine, StepTrace
from fastdeploy.entrypoints.local_router import LocalPDRouter
from fastdeploy.model_executor.models import Model
from fastdeploy.splitwise import Clock, HandoffDeadlines, HandoffTransport, InProcessTransport, MonotonicClock
from fastdeploy.splitwise.mooncake import MooncakeKVTransfer
from fastdeploy.worker import make_runner
from fastdeploy.worker.kv_transfer import PromptKVPort

TraceHook = Callable[[StepTrace], None]
logger = logging.getLogger("fastdeploy.engine")


def kv_cache_bytes(config: FDConfig, model: Model) -> int:
    per_token = (sum(int(np.prod(tail)) for tail in model.kv_layer_tails())
                 * kv_storage_dtype(config.kv_dtype).itemsize)
    return config.cache.num_kv_blocks * config.cache.block_size * per_token


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_model(config: FDConfig, model: Model) -> None:
    """Start-up refusals that need the loaded model: MTP (K > 0) of a model without an MTP module, and a KV
    cache larger than the host memory left (allocating it would get the process killed instead)."""
    k = config.num_speculative_tokens
    if k > 0 and model.num_mtp_layers == 0:
        raise ValueError(f"checkpoint '{model.name}' has no MTP weights: speculative method "
                         f"{config.speculative.method!r} with num_speculative_tokens {k} needs an MTP module "
                         f"(serve it with K = 0)")
    precision = getattr(model, "precision", None)   # a checkpoint model's; it keys the KV (config.kv_identity)
    if precision is not None:
        wanted = parse_quantization(config.quantization).for_model(model.has_experts())
        if (precision.dtype, precision.quantization) != (config.dtype, wanted):
            raise ValueError(f"checkpoint '{model.name}' was loaded in {precision.describe()}, the instance is "
                             f"configured for {config.dtype}, {wanted.name or 'no quantization'}")
    need, free = kv_cache_bytes(config, model), available_memory()
    if free is not None and config.ops_backend != "xpu3" and need > free:
        raise ValueError(f"the KV cache does not fit: {config.cache.num_kv_blocks} blocks of "
                         f"{config.cache.block_size} tokens take {need / 2 ** 30:.2f} GiB, {free / 2 ** 30:.2f} GiB "
                         f"of memory is available; lower --num-kv-blocks, --max-model-len or --max-num-seqs")


def memory_line(config: FDConfig, model: Model, kv_bytes: int) -> str:
    """The one start-up line about memory: weights and KV cache, and the sizes they follow from."""
    mib = 2 ** 20
    precision = getattr(model, "precision", None)   # a checkpoint's (fastdeploy/precision.py); embedded: dtype
    weights = model.dtype if precision is None else precision.describe()
    auto = " (--dtype auto)" if config.dtype_was_auto else ""
    return (f"{config.role} instance of {model.name}: weights {model.weight_bytes() / mib:.1f} MiB {weights}{auto}, "
            f"KV cache {kv_bytes / mib:.1f} MiB {config.kv_dtype} ({config.cache.num_kv_blocks} blocks x "
            f"{config.cache.block_size} "
            f"tokens, {len(model.kv_layer_tails())} layers x {model.kv_layer_tails()[0]}; from "
            f"{config.cache.budget_source or 'the config'}; pages resident as they are first written), max_model_len "
            f"{config.scheduler.max_model_len}")


def build_engine(config: FDConfig, model: Model, transport: HandoffTransport | None = None,
                 clock: Clock | None = None, deadlines: HandoffDeadlines | None = None,
                 trace_hook: TraceHook | None = None, idle_poll_s: float = IDLE_POLL_S,
                 transfer_host: str = "127.0.0.1", mooncake_device: str = "", staging_slots: int | None = None,
                 chat_template: str = "built-in") -> LLMEngine:
    """One instance of `config.role` over its own runner, KV cache, slots and blocks; PD roles need `transport`.
    `chat_template` identifies the front end's template (a digest of its file; in the config hash).
    With a Mooncake `config.cache.transfer_protocol` the instance starts its transfer engine on `transfer_host`
    (where the peer reaches it) and registers its KV cache, and P its staging pool of `staging_slots` slots (None:
    the default; 0: P writes from its KV blocks in place); MooncakeError if that fails."""
    check_model(config, model)
    runner = make_runner(config, model)
    logger.info(memory_line(config, model, kv_cache_bytes(config, model)))
    if config.scheduler.async_scheduling:
        logger.info("%s instance: async scheduling (each step planned while the previous one computes)", config.role)
    connector: KVConnector
    if config.role == "mixed":
        connector = MixedConnector()
    else:
        if transport is None:
            raise ValueError(f"build_engine: a {config.role} instance needs argument 'transport'")
        kv = PromptKVPort(runner.kv, model.num_target_layers)
        protocol = config.cache.transfer_protocol
        # P stages its writes (a slot per hand-off of the longest prompt) so a stalled write holds no KV block
        staging_tokens = config.scheduler.max_model_len if config.role == "prefill" else 0
        kv_transfer = None if protocol == "zmq" else \
            MooncakeKVTransfer.start(kv, protocol.removeprefix("mooncake-"), mooncake_device, transfer_host,
                                     staging_tokens, staging_slots)
        role_connector = PrefillConnector if config.role == "prefill" else DecodeConnector
        connector = role_connector(transport, kv, clock, deadlines, kv_transfer)
    # the tokenizer's identity digests a checkpoint's tokenizer files and template: P and D must tokenize alike
    identity = {"tokenizer": model.tokenizer.identity, "chat_template": chat_template}
    return LLMEngine(config, runner, model.eos_token_ids, model.vocab_size, connector, trace_hook=trace_hook,
                     idle_poll_s=idle_poll_s, text_identity=identity)


def with_role(config: FDConfig, role: str) -> FDConfig:
    """A copy of `config` (and of its sub-configs) for an instance of `role`. The copy's blocks are the
    original's, so its start line keeps the original's `budget_source` (re-derived, it would name the blocks as
    if `--num-kv-blocks` had been given)."""
    copy = replace(config, role=role, cache=replace(config.cache), scheduler=replace(config.scheduler))
    copy.cache.budget_source = config.cache.budget_source
    return copy


def build_local_pd(config: FDConfig, model: Model, clock: Clock | None = None,
                   deadlines: HandoffDeadlines | None = None, transport: InProcessTransport | None = None,
                   prefill_trace_hook: TraceHook | None = None,
                   decode_trace_hook: TraceHook | None = None) -> LocalPDRouter:
    """Both instances in this process, from one config and one model object, joined by `transport` (default: a
    new InProcessTransport on `clock`). The KV moves inside the transport's messages: a one-sided transfer engine
    has nothing to add within one process."""
    if config.cache.transfer_protocol != "zmq":
        raise ValueError(f"build_local_pd: field 'cache.transfer_protocol' must be 'zmq' for P and D in one process "
                         f"(got {config.cache.transfer_protocol!r}); Mooncake serves P and D as services")
    clock = clock if clock is not None else MonotonicClock()
    transport = transport if transport is not None else InProcessTransport(clock=clock)
    # P never waits when idle here: D steps in the same thread right after it (and D waits when both are idle).
    prefill = build_engine(with_role(config, "prefill"), model, transport, clock, deadlines, prefill_trace_hook,
                           idle_poll_s=0.0)
    decode = build_engine(with_role(config, "decode"), model, transport, clock, deadlines, decode_trace_hook)
    return LocalPDRouter(prefill, decode, transport)
