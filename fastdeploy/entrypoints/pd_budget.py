"""How `fastdeploy serve --pd` (and `LLM(splitwise=True)`, `in_process_share`) shares one host's KV budget among
its prefill and decode instances (docs/serving.md "Memory"): one total, split in proportion to the instances' slots
(kv_budget.split_host_budget), and one max_model_len that every share holds (P and D must agree on it: it is in
the PD config hash)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastdeploy.config import EMBEDDED_MODELS, FDConfig, estimated_weight_bytes
from fastdeploy.entrypoints.openai.serve_args import config_from_args
from fastdeploy.kv_budget import (DEFAULT_PD_HOST_KV_CACHE_BYTES, gib, host_memory_bytes, parse_bytes,
                                  resolve_budget, split_host_budget)


@dataclass(frozen=True, slots=True)
class KVShares:
    prefill_bytes: int          # each prefill instance's --kv-cache-memory-bytes
    decode_bytes: int           # each decode instance's
    max_model_len: int          # every instance's --max-model-len
    line: str                   # what the supervisor prints at start

    def flags(self, role: str) -> list[str]:
        share = self.prefill_bytes if role == "prefill" else self.decode_bytes
        return ["--kv-cache-memory-bytes", str(share), "--max-model-len", str(self.max_model_len)]


def host_kv_budget(args: argparse.Namespace, num_instances: int) -> tuple[int, str]:
    """The whole deployment's KV bytes and where the figure comes from: --kv-cache-memory-bytes (the total here),
    else --gpu-memory-utilization of the host's memory less every instance's weights, else the default."""
    if args.kv_cache_memory_bytes is not None:
        total = parse_bytes(args.kv_cache_memory_bytes)
        return total, f"--kv-cache-memory-bytes {gib(total)}"
    if args.gpu_memory_utilization is None:
        return DEFAULT_PD_HOST_KV_CACHE_BYTES, f"the default {gib(DEFAULT_PD_HOST_KV_CACHE_BYTES)} for the host"
    from fastdeploy.model_executor.models.checkpoint import read_checkpoint_config   # no Paddle
    host = host_memory_bytes()
    if host is None:
        raise ValueError("--gpu-memory-utilization: this host reports no MemTotal; give --kv-cache-memory-bytes")
    weights = num_instances * estimated_weight_bytes(read_checkpoint_config(args.model), args.dtype)
    total = int(args.gpu_memory_utilization * host) - weights
    if total < 1:
        raise ValueError(f"--gpu-memory-utilization {args.gpu_memory_utilization:g} of the host's {gib(host)} "
                         f"leaves nothing for the KV cache after {num_instances} instances' weights ({gib(weights)})")
    return total, (f"--gpu-memory-utilization {args.gpu_memory_utilization:g} of the host's {gib(host)} less "
                   f"{num_instances} x the weights")


def _role_config(args: argparse.Namespace, role: str, slots: int, share: int) -> FDConfig:
    view = argparse.Namespace(**{**vars(args), "splitwise_role": role, "max_num_seqs": slots,
                                 "kv_cache_memory_bytes": share, "gpu_memory_utilization": None})
    try:
        return config_from_args(view)
    except ValueError as error:
        raise ValueError(f"{role} instance's share of the host's KV budget ({gib(share)}): {error} (with --pd, "
                         f"--kv-cache-memory-bytes is the whole deployment's, shared by slots)") from None


def share_host_budget(args: argparse.Namespace, num_prefill: int, num_decode: int,
                      decode_slots: int) -> KVShares | None:
    """The KV share of each role and the common max_model_len; None when the instances size their own cache
    (--num-kv-blocks, or an embedded model's few MiB). ValueError (one line) when a share cannot hold one request
    at max_model_len."""
    if args.num_kv_blocks is not None or args.model in EMBEDDED_MODELS:
        return None
    total, source = host_kv_budget(args, num_prefill + num_decode)
    prefill, decode = split_host_budget(total, num_prefill, args.max_num_seqs, num_decode, decode_slots)
    configs = [_role_config(args, "prefill", args.max_num_seqs, prefill),
               _role_config(args, "decode", decode_slots, decode)]
    max_model_len = min(c.scheduler.max_model_len for c in configs)
    line = (f"KV budget {gib(total)} from {source}, shared by slots: {num_prefill} prefill x {gib(prefill)}, "
            f"{num_decode} decode x {gib(decode)}; max_model_len {max_model_len}")
    return KVShares(prefill, decode, max_model_len, line)


@dataclass(frozen=True, slots=True)
class InProcessShare:
    bytes: int      # each of P's and D's --kv-cache-memory-bytes
    source: str     # what the start line says the figure comes from


def in_process_share(model: str, dtype: str, kv_cache_memory_bytes: int | None,
                     gpu_memory_utilization: float | None) -> InProcessShare:
    """`LLM(splitwise=True)` / `fastdeploy generate --pd`: a prefill and a decode instance with the same slots in
    one process over one model object share one KV budget, as `serve --pd` shares the host's: the given bytes,
    else `gpu_memory_utilization` of the host's memory less the weights (held once), else the PD default; halved
    (split_host_budget with equal slots)."""
    if kv_cache_memory_bytes is not None:
        total, source = kv_cache_memory_bytes, f"kv_cache_memory_bytes {gib(kv_cache_memory_bytes)}"
    elif gpu_memory_utilization is None:
        total, source = DEFAULT_PD_HOST_KV_CACHE_BYTES, f"the default {gib(DEFAULT_PD_HOST_KV_CACHE_BYTES)} for P and D"
    else:
        from fastdeploy.model_executor.models.checkpoint import read_checkpoint_config   # no Paddle
        from fastdeploy.precision import resolve_dtype
        weights = estimated_weight_bytes(read_checkpoint_config(model), resolve_dtype(dtype, embedded=False))
        budget = resolve_budget(None, gpu_memory_utilization, weights)
        total, source = budget.bytes, budget.source
    share, _ = split_host_budget(total, 1, 1, 1, 1)
    return InProcessShare(share, f"half of {source} each (prefill and decode in one process share it)")
