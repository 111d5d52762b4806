"""FastDeploy's launch flags that its published ERNIE and PD command lines use and that have no counterpart here
(docs/serving.md "FastDeploy's flags"): each is accepted and ignored with a note at start when ignoring it cannot
change an answer, or refused with one line saying why it cannot apply. The flags that have a meaning here
(--max-num-seqs, --quantization, --splitwise-role, ...) are ordinary flags of serve_args."""
from __future__ import annotations

import argparse

from fastdeploy.config import EMBEDDED_MODELS

# dest -> why it is harmless to ignore (the note printed at start when the flag is given)
IGNORED = {
    "kv_cache_ratio": "one KV pool serves prefill and decode here (its size: --gpu-memory-utilization, "
                      "--kv-cache-memory-bytes or --num-kv-blocks)",
    "engine_worker_queue_port": "no engine worker queue here (the engine core is one process on a pipe)",
    "cache_queue_port": "no cache-manager process here",
    "rdma_comm_ports": "P moves KV over the P/D connector (--pd-comm-port, --cache-transfer-protocol)",
    "innode_prefill_ports": "P and D are paired by the router (--router), not by ports",
    "enable_chunked_prefill": "prefill is always chunked under --max-num-batched-tokens",
    "trust_remote_code": "no checkpoint code is run: the supported architectures are built in",
    "load_choices": "one loader here",
    "use_cudagraph": "no CUDA graphs on this backend",
    "graph_optimization_config": "no CUDA graphs on this backend",
    "enable_logprob": "logprobs are always available",
    "enable_expert_parallel": "one device holds every expert",
    "swap_space": "no KV swap space (preempted requests are recomputed)",
}


# the flags that give a checkpoint's KV budget in bytes (fastdeploy/kv_budget.py)
BUDGET_FLAGS = ("gpu_memory_utilization", "kv_cache_memory_bytes")

# FastDeploy's --cache-transfer-protocol values, taken as zmq here (serve_args adds them to the choices)
FASTDEPLOY_PROTOCOLS = ("ipc", "rdma", "rdma,ipc", "ipc,rdma")


def translate_fastdeploy_values(args: argparse.Namespace) -> list[str]:
    """Rewrites FastDeploy's values that this server spells otherwise, before the flags are checked; one note per
    rewrite. Its IPC is the zmq connector here; its RDMA library is not here, and the KV moving over TCP instead
    changes no answer."""
    given = args.cache_transfer_protocol
    if given not in FASTDEPLOY_PROTOCOLS:
        return []
    args.cache_transfer_protocol = "zmq"
    if given == "ipc":
        return ["note: --cache-transfer-protocol ipc is zmq here (the KV moves in the P/D connector's messages)"]
    return [f"note: --cache-transfer-protocol {given}: FastDeploy's RDMA library is not here, so the KV moves in the "
            f"zmq connector's messages (for RDMA: mooncake-rdma with --mooncake-device)"]


def add_fastdeploy_flags(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--tensor-parallel-size", type=int, default=1, help="FastDeploy's: only 1 (one device per instance here)")
    a("--data-parallel-size", type=int, default=1,
      help="FastDeploy's: only 1 (more instances: several behind the router)")
    a("--gpu-memory-utilization", type=float, default=None,
      help="FastDeploy's: the share (0, 1] of the device's memory for weights and KV; the device is the host here, "
           "so a checkpoint's KV budget is this share of MemTotal less the weights (default: the 4 GiB KV space)")
    a("--kv-cache-ratio", type=float, default=None,
      help="FastDeploy's: accepted, ignored (one KV pool; see --kv-cache-memory-bytes)")
    for flag in ("--engine-worker-queue-port", "--cache-queue-port", "--rdma-comm-ports", "--innode-prefill-ports"):
        a(flag, default=None, metavar="PORT[,PORT...]", help="FastDeploy's: accepted, ignored (no such component "
                                                             "here)")
    for flag in ("--enable-chunked-prefill", "--trust-remote-code", "--use-cudagraph", "--enable-logprob",
                 "--enable-expert-parallel"):
        a(flag, action="store_true", help="FastDeploy's: accepted, ignored (docs/serving.md); default: off")
    a("--load-choices", "--load_choices", dest="load_choices", default=None,
      help="FastDeploy's loader version: accepted, ignored (one loader here)")
    a("--graph-optimization-config", default=None, metavar="JSON", help="FastDeploy's: accepted, ignored (no CUDA "
                                                                        "graphs)")
    a("--swap-space", type=float, default=None, help="FastDeploy's: accepted, ignored (no KV swap)")
    a("--reasoning-parser", default=None, metavar="NAME", help="FastDeploy's: refused (no reasoning parser here)")
    a("--tool-call-parser", default=None, metavar="NAME", help="FastDeploy's: refused (no tool parser here)")
    a("--scheduler-name", default="local", help="FastDeploy's: only local (PD requests go through --router)")


def fastdeploy_flags_problem(args: argparse.Namespace) -> str | None:
    """The FastDeploy flag given that cannot apply here, as one line, or None."""
    if args.tensor_parallel_size != 1:
        return (f"--tensor-parallel-size {args.tensor_parallel_size}: one device per instance on this backend (no "
                f"tensor parallelism); use 1")
    if args.data_parallel_size != 1:
        return (f"--data-parallel-size {args.data_parallel_size}: one instance per process here; run several "
                f"behind the router (fastdeploy serve --pd --num-decode N)")
    for flag, name in (("--reasoning-parser", args.reasoning_parser), ("--tool-call-parser", args.tool_call_parser)):
        if name is not None:
            return (f"{flag} {name}: no such parser here, so reasoning and tool calls would come back as plain "
                    f"text in 'content'; drop the flag")
    if args.scheduler_name != "local":
        return (f"--scheduler-name {args.scheduler_name}: only the local scheduler here; PD requests go through "
                f"the router (--router, fastdeploy serve --pd)")
    for name in ("gpu_memory_utilization", "kv_cache_ratio"):
        value = getattr(args, name)
        if value is not None and not 0 < value <= 1:
            return f"--{name.replace('_', '-')} must be in (0, 1], got {value}"
    return None


def fastdeploy_flag_notes(args: argparse.Namespace) -> list[str]:
    """One line per FastDeploy flag given that this server ignores, saying why."""
    notes = [f"note: --{name.replace('_', '-')} ignored: {why}" for name, why in IGNORED.items()
             if getattr(args, name, None) not in (None, False)]
    if getattr(args, "model", None) in EMBEDDED_MODELS:   # a byte budget sizes a checkpoint's cache only
        notes += [f"note: --{name.replace('_', '-')} ignored: {args.model}'s KV cache is every slot at "
                  f"max_model_len (a few MiB); a budget sizes a checkpoint's" for name in BUDGET_FLAGS
                  if getattr(args, name, None) is not None]
    return notes
