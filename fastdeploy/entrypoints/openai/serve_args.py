"""Defines the API server's command-line flags (SERVICES §2) and checks their combinations.

Kept free of Paddle and of the HTTP stack: the API server parses the flags, and the engine core receives the same
namespace (as JSON) to build its instance from.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from fastdeploy.precision import DTYPE_CHOICES, KV_CACHE_DTYPE_CHOICES
from fastdeploy.config import (EMBEDDED_MODELS, OPS_BACKENDS, ROLES, TRANSFER_PROTOCOLS, CacheConfig, FDConfig, SchedulerConfig,
                               SpeculativeConfig)
from fastdeploy.entrypoints.chat_template import ChatTemplate
from fastdeploy.http.sockets import DEFAULT_KEEP_ALIVE_S
from fastdeploy.kv_budget import parse_bytes
from fastdeploy.entrypoints.openai.generation_defaults import sampling_defaults
from fastdeploy.entrypoints.openai.fastdeploy_flags import (FASTDEPLOY_PROTOCOLS, add_fastdeploy_flags,
                                                            fastdeploy_flag_notes, fastdeploy_flags_problem,
                                                            translate_fastdeploy_values)
from fastdeploy.splitwise.secret import load_pd_secret

DEFAULT_MAX_BODY_BYTES = 1 << 20
# Exit status when the server cannot listen on --host:--port (in use, or not an address of this machine): uvicorn's
# own status for a server that could not start (docs/serving.md "Flags").
EXIT_CANNOT_LISTEN = 3


class OneLineParser(argparse.ArgumentParser):
    """Bad flags exit 2 with one line on stderr (the usage is one `--help` away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: ...)" after each flag's help, unless the help already says what the default is."""

    def _get_help_string(self, action):
        text = action.help or ""
        return text if "default" in text else super()._get_help_string(action)


def add_server_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every flag of one serving instance; shared by `python -m ...api_server` and `fastdeploy serve`."""
    a = parser.add_argument
    a("--model", default="fd-tiny", metavar="NAME|PATH",
      help="an embedded model (fd-tiny, fd-toy) or a checkpoint directory (config.json, *.safetensors, tokenizer "
           "files; README 'Serve your model')")
    a("--tokenizer", default=None, metavar="PATH",
      help="directory of the tokenizer files (default: --model's)")
    a("--host", default="0.0.0.0", help="address to listen on")
    a("--port", type=int, default=8180, help="HTTP port")
    a("--metrics-port", type=int, default=None, help="port for /metrics (default: the HTTP port)")
    a("--max-num-seqs", type=int, default=8, help="request slots (requests decoded together)")
    a("--max-model-len", type=int, default=None,
      help="prompt + output tokens of one request (default: the model's: 512 for the embedded models, a "
           "checkpoint's max_position_embeddings within the KV budget; above a checkpoint's is refused)")
    a("--max-num-batched-tokens", type=int, default=256, help="token budget of one engine step")
    a("--async-scheduling", action=argparse.BooleanOptionalAction, default=False,
      help="plan each engine step while the previous one computes (the same outputs; docs/design.md §10 says when "
           "it pays)")
    a("--num-kv-blocks", "--num-gpu-blocks-override", dest="num_kv_blocks", type=int, default=None,
      help="KV blocks in the pool (default: what the KV budget holds, at most every slot at max-model-len; an "
           "embedded model: every slot)")
    a("--kv-cache-memory-bytes", default=None, metavar="SIZE",
      help="a checkpoint's KV budget, e.g. 1G or 512MiB (binary units; default: --gpu-memory-utilization's share, "
           "else 4 GiB; docs/serving.md 'Memory')")
    a("--block-size", type=int, default=16, help="tokens per KV block")
    a("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
      help="reuse the KV of full prompt blocks already computed (PD_MTP_FLOW §13)")
    a("--report-cached-tokens", action=argparse.BooleanOptionalAction, default=True,
      help="report each request's prefix-cache hit as usage.prompt_tokens_details.cached_tokens (--no-...: 0, "
           "so no client learns whether another sent a prompt; requests may also set 'cache_salt')")
    a("--speculative-config", default=None, metavar="JSON",
      help='e.g. \'{"method": "mtp", "num_speculative_tokens": 1}\' (K defaults to 1 with "mtp"; '
           'default: no speculation)')
    a("--splitwise-role", default="mixed", choices=ROLES, help="mixed: prefill and decode in this instance")
    a("--router", default=None, metavar="HOST:PORT", help="register with this router")
    a("--advertise-host", default=None, metavar="ADDRESS",
      help="the address the router and PD peers reach this instance at (its HTTP, connector and Mooncake "
           "addresses; default: --host when it is one address, else the address of the interface that reaches "
           "--router)")
    a("--pd-comm-port", type=int, default=None,
      help="P/D connector port (prefill and decode roles only; default: a free port)")
    a("--pd-secret-file", default=None, metavar="PATH",
      help="file holding the P/D connector's shared secret (default: FD_PD_SECRET, else none)")
    a("--pd-timeout-secs", type=float, default=None,
      help="P/D hand-off deadlines: decode allocation, prefill result and KV transfer all this long, the "
           "reservation match 1.5 x (default: 60, 300, 60 and 90 s)")
    a("--pd-min-transfer-mbps", type=float, default=None, metavar="MBIT_S",
      help="the floor rate of a hand-off's KV (Mbit/s): the prefill result and KV transfer deadlines each get the "
           "time the hand-off's bytes take at this rate on top of --pd-timeout-secs (default: 100)")
    a("--pd-reservation-ack-timeout-secs", type=float, default=None,
      help="decode role: fail a request whose reservation no prefill instance acknowledged within this long "
           "(P acknowledges as soon as it reads it; default: 5)")
    a("--cache-transfer-protocol", default="zmq", choices=TRANSFER_PROTOCOLS + FASTDEPLOY_PROTOCOLS,
      help="how P moves a prompt's KV to D: in the ZeroMQ connector's messages, or one-sided into D's blocks "
           "through the Mooncake transfer engine (FastDeploy's 'ipc', 'rdma' and 'rdma,ipc' are taken as zmq, with "
           "a note)")
    a("--mooncake-device", default="", metavar="NAME",
      help="RDMA device for --cache-transfer-protocol mooncake-rdma (e.g. mlx5_0)")
    a("--mooncake-staging-slots", type=int, default=None, metavar="N",
      help="prefill role with Mooncake: hand-offs P may write from its staging memory at once, each slot the bytes of "
           "a --max-model-len hand-off, registered at start (with RDMA, pinned); 0 writes from the KV blocks in place, "
           "holding them until the write lets go (default: 4)")
    a("--health-interval-secs", type=float, default=5.0,
      help="with --router: register (heartbeat) this often")
    a("--max-concurrency", type=int, default=None, help="concurrent requests beyond which HTTP 429 (default: none)")
    a("--api-key", default=None, help="require 'Authorization: Bearer <key>' on /v1/* (default: FD_API_KEY, which "
                                      "keeps the key off the command line, else no key)")
    a("--ops-backend", default="cpu", choices=OPS_BACKENDS, help="state-op backend")
    add_precision_flags(parser)
    a("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="request body limit (HTTP 413 beyond)")
    a("--timeout-keep-alive", type=float, default=DEFAULT_KEEP_ALIVE_S, metavar="SECONDS",
      help="close a client's keep-alive connection after it has been idle this long (above the idle timeout of the "
           "client's connection pool, so a reused connection is never one the server is closing)")
    a("--drain-timeout-s", type=float, default=30.0, help="on SIGTERM, how long in-flight requests may finish")
    a("--heartbeat-timeout-s", type=float, default=30.0,
      help="engine core silent this long is declared dead (a thread of it reports every 0.5 s, however long a "
           "step runs)")
    a("--step-timeout-s", type=float, default=None,
      help="one engine step running this long is declared hung (default: no bound; a long step is logged)")
    a("--log-level", default="info", choices=("debug", "info", "warning", "error"), help="log level")
    add_openai_flags(parser)
    add_fastdeploy_flags(parser)
    return parser


def add_precision_flags(parser: argparse.ArgumentParser) -> None:
    """--dtype and --quantization, FastDeploy's flags, and vLLM's --kv-cache-dtype (fastdeploy/precision.py,
    docs/models.md "Precision")."""
    parser.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES,
                        help="how a checkpoint's unquantized weights are stored: auto is bfloat16 on a CPU with "
                             "avx512_bf16, else float32; the embedded models are float32 only")
    parser.add_argument("--quantization", default=None, metavar="METHOD",
                        help="weight-only quantization at load: wint8, wint4 (on ERNIE MoE: dense WINT8, experts "
                             "WINT4), or FastDeploy's JSON form '{\"quantization\": \"mix_quant\", "
                             "\"dense_quant_type\": \"wint8\", \"moe_quant_type\": \"wint4\"}'")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPE_CHOICES,
                        help="how the KV cache is stored: auto is the model's dtype (bfloat16 with --dtype bfloat16 "
                             "or --quantization, else float32); bfloat16 halves the cache and the P->D hand-off")


class _ListAction(argparse.Action):
    """One or more values; a value written as a JSON list (vLLM's spelling, e.g. '["*"]') is expanded."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = []
        for value in values:
            if value.startswith("["):
                try:
                    loaded = json.loads(value)
                except json.JSONDecodeError:
                    loaded = None
                if not isinstance(loaded, list) or not all(isinstance(v, str) for v in loaded):
                    parser.error(f"{option_string}: {value!r} is not a JSON list of strings")
                items.extend(loaded)
            else:
                items.append(value)
        setattr(namespace, self.dest, items)


def add_openai_flags(parser: argparse.ArgumentParser) -> None:
    """The OpenAI front end's flags, spelled as vLLM spells them (docs/serving.md, "Flags")."""
    a = parser.add_argument
    a("--served-model-name", nargs="+", default=None, metavar="NAME",
      help="the model's name(s) in the API: the first is reported, any is accepted in 'model' (default: the "
           "embedded model's name, or the checkpoint directory's name)")
    a("--chat-template", default=None, metavar="FILE",
      help="Jinja chat template file, rendered as Hugging Face and vLLM do (default: the checkpoint's own, from "
           "its tokenizer_config.json or chat_template.jinja; the built-in template for the embedded models)")
    a("--generation-config", default="auto", metavar="auto|vllm|FOLDER",
      help="request sampling defaults (temperature, top_p, top_k, min_p, repetition_penalty) from the "
           "checkpoint's generation_config.json ('auto'), another folder's, or none ('vllm'), as vLLM")
    a("--allowed-origins", nargs="+", action=_ListAction, default=None, metavar="ORIGIN",
      help="CORS: origins allowed to call the API from a browser, '*' for any (default: no CORS headers)")
    a("--allowed-methods", nargs="+", action=_ListAction, default=["*"], metavar="METHOD",
      help="CORS: allowed methods (with --allowed-origins)")
    a("--allowed-headers", nargs="+", action=_ListAction, default=["*"], metavar="HEADER",
      help="CORS: allowed request headers (with --allowed-origins)")
    a("--allow-credentials", action="store_true", help="CORS: allow credentials (with --allowed-origins)")
    a("--ssl-keyfile", default=None, metavar="PATH", help="TLS private key (PEM); needs --ssl-certfile")
    a("--ssl-certfile", default=None, metavar="PATH", help="TLS certificate chain (PEM); needs --ssl-keyfile")


# what the API server's one-line errors start with (`PROG: error: ...`, argparse's form), as its parser's
SERVER_PROG = "fastdeploy.entrypoints.openai.api_server"


def build_parser(prog: str = SERVER_PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description="OpenAI-compatible API server for one FastDeploy instance",
                           formatter_class=DefaultsHelpFormatter)
    return add_server_flags(parser)


def config_from_args(args: argparse.Namespace) -> FDConfig:
    """The FDConfig the flags describe; ValueError names the bad field."""
    try:
        spec = json.loads(args.speculative_config) if args.speculative_config else None
    except json.JSONDecodeError as error:
        raise ValueError(f"--speculative-config is not valid JSON ({error})") from None
    return FDConfig(model=args.model, dtype=args.dtype, quantization=args.quantization, role=args.splitwise_role, ops_backend=args.ops_backend,
                    speculative=SpeculativeConfig.from_user(spec), enable_prefix_caching=args.enable_prefix_caching,
                    report_cached_tokens=args.report_cached_tokens,
                    cache=CacheConfig(block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
                                      transfer_protocol=args.cache_transfer_protocol,
                                      kv_cache_memory_bytes=None if args.kv_cache_memory_bytes is None
                                      else parse_bytes(args.kv_cache_memory_bytes),
                                      gpu_memory_utilization=args.gpu_memory_utilization,
                                      kv_cache_dtype=args.kv_cache_dtype),
                    scheduler=SchedulerConfig(max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                                              max_num_batched_tokens=args.max_num_batched_tokens,
                                              async_scheduling=args.async_scheduling))


def _transfer_problem(args: argparse.Namespace) -> str | None:
    """--cache-transfer-protocol: only for PD roles; Mooncake must load here, and RDMA needs its device."""
    protocol = args.cache_transfer_protocol
    staging = args.mooncake_staging_slots
    if staging is not None and (protocol == "zmq" or args.splitwise_role != "prefill"):
        return "--mooncake-staging-slots needs --splitwise-role prefill and a mooncake --cache-transfer-protocol"
    if staging is not None and staging < 0:
        return f"--mooncake-staging-slots must be >= 0 (got {staging})"
    if protocol == "zmq":
        return "--mooncake-device needs --cache-transfer-protocol mooncake-rdma" if args.mooncake_device else None
    if args.splitwise_role == "mixed":
        return f"--cache-transfer-protocol {protocol} needs --splitwise-role prefill or decode"
    if protocol == "mooncake-rdma" and not args.mooncake_device:
        return "--cache-transfer-protocol mooncake-rdma needs --mooncake-device (the RDMA NIC, e.g. mlx5_0)"
    from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason, rdma_devices   # no Paddle
    unavailable = mooncake_unavailable_reason()
    if unavailable:
        return f"--cache-transfer-protocol {protocol}: {unavailable}"
    if protocol == "mooncake-rdma" and args.mooncake_device not in rdma_devices():
        return (f"--mooncake-device {args.mooncake_device}: no such RDMA device (this machine has "
                f"{', '.join(rdma_devices()) or 'none'})")
    return None


def served_model_names(args: argparse.Namespace) -> tuple[str, ...]:
    """--served-model-name, else the embedded model's name or the checkpoint directory's name (vLLM and
    FastDeploy serve a path under its last component)."""
    if args.served_model_name:
        return tuple(args.served_model_name)
    if args.model in EMBEDDED_MODELS:
        return (args.model,)
    return (Path(args.model).resolve().name,)


def model_aliases(args: argparse.Namespace) -> tuple[str, ...]:
    """Without --served-model-name, a checkpoint is also found by the --model string as given (vLLM serves that
    string; clients copy it from the command line)."""
    return (args.model,) if not args.served_model_name and args.model not in EMBEDDED_MODELS else ()


def check_model_args(args: argparse.Namespace) -> str | None:
    """--model names an embedded model or a checkpoint directory of a supported architecture, and its tokenizer
    (or --tokenizer's) loads: one line naming the path and what is missing, at start rather than at the first
    request (the weights are checked where they are loaded, in the engine core)."""
    from fastdeploy.tokenizer import get_tokenizer   # sentencepiece / tokenizers, no Paddle
    from fastdeploy.tokenizer.loader import no_such_model
    if args.model not in EMBEDDED_MODELS and not Path(args.model).is_dir():
        return f"--model {args.model}: {no_such_model(args.model)}"
    if args.model not in EMBEDDED_MODELS:   # config.json and the architecture, before the engine core loads Paddle
        from fastdeploy.model_executor.models import check_architecture, check_speculative
        from fastdeploy.model_executor.models.checkpoint import read_checkpoint_config
        try:
            config = read_checkpoint_config(args.model)
            check_architecture(config.architecture, args.model)
        except ValueError as error:
            return f"--model: {error}"
        try:
            spec = SpeculativeConfig.from_user(json.loads(getattr(args, "speculative_config", None) or "null"))
        except ValueError:
            spec = None   # a malformed --speculative-config is reported where the engine config is built
        try:
            check_speculative(config, spec)   # MTP asked of a checkpoint (or a 'model' directory) without MTP weights
        except ValueError as error:
            return f"--speculative-config: {error}"
    flag, path = ("--tokenizer", args.tokenizer) if args.tokenizer is not None else ("--model", args.model)
    try:
        get_tokenizer(path)
    except ValueError as error:
        return f"{flag} {path}: {error}" if not str(error).startswith(path) else f"{flag}: {error}"
    return None


def check_args(args: argparse.Namespace) -> str | None:
    """The first contradiction among the flags, as one line, or None."""
    problem = check_model_args(args)
    if problem is not None:
        return problem
    if args.splitwise_role == "mixed" and (args.pd_comm_port is not None or args.pd_secret_file is not None
                                           or args.pd_timeout_secs is not None
                                           or args.pd_min_transfer_mbps is not None):
        return ("--pd-comm-port, --pd-secret-file, --pd-timeout-secs and --pd-min-transfer-mbps need "
                "--splitwise-role prefill or decode")
    problem = _transfer_problem(args)
    if problem is not None:
        return problem
    if args.pd_timeout_secs is not None and not args.pd_timeout_secs > 0:
        return f"--pd-timeout-secs must be > 0, got {args.pd_timeout_secs}"
    if args.pd_min_transfer_mbps is not None and not args.pd_min_transfer_mbps > 0:
        return f"--pd-min-transfer-mbps must be > 0, got {args.pd_min_transfer_mbps}"
    ack_s = args.pd_reservation_ack_timeout_secs
    if ack_s is not None and (args.splitwise_role != "decode" or not ack_s > 0):
        return f"--pd-reservation-ack-timeout-secs needs --splitwise-role decode and a value > 0, got {ack_s}"
    if args.health_interval_secs <= 0:
        return f"--health-interval-secs must be > 0, got {args.health_interval_secs}"
    if args.pd_secret_file is not None:
        try:
            load_pd_secret(args.pd_secret_file)
        except ValueError as error:
            return str(error)
    for name in ("port", "metrics_port", "pd_comm_port"):
        value = getattr(args, name)
        if value is not None and not 0 < value < 65536:
            return f"--{name.replace('_', '-')} must be in 1..65535, got {value}"
    for name in ("max_concurrency", "max_body_bytes"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {value}"
    if not args.timeout_keep_alive > 0:
        return f"--timeout-keep-alive must be > 0, got {args.timeout_keep_alive}"
    if args.drain_timeout_s < 0 or args.heartbeat_timeout_s <= 0:
        return "--drain-timeout-s must be >= 0 and --heartbeat-timeout-s > 0"
    if args.step_timeout_s is not None and args.step_timeout_s <= 0:
        return f"--step-timeout-s must be > 0, got {args.step_timeout_s}"
    problem = check_openai_args(args) or fastdeploy_flags_problem(args)
    if problem is not None:
        return problem
    try:
        config_from_args(args)
    except ValueError as error:
        return str(error)
    return None


def check_openai_args(args: argparse.Namespace) -> str | None:
    """The first problem with the OpenAI front end's flags, as one line, or None."""
    names = args.served_model_name
    if names is not None and any(not name.strip() for name in names):
        return "--served-model-name: names must not be empty"
    if (args.ssl_keyfile is None) != (args.ssl_certfile is None):
        return "--ssl-keyfile and --ssl-certfile go together"
    for flag, path in (("--ssl-keyfile", args.ssl_keyfile), ("--ssl-certfile", args.ssl_certfile)):
        if path is not None and not os.access(path, os.R_OK):
            return f"{flag} {path}: not a readable file"
    if args.allowed_origins is None and args.allow_credentials:
        return "--allow-credentials needs --allowed-origins"
    if args.chat_template is not None:
        try:
            ChatTemplate.from_file(args.chat_template)
        except ValueError as error:
            return str(error)
    try:
        sampling_defaults(args.model, args.generation_config)
    except ValueError as error:
        return str(error)
    return None


def cannot_listen(host: str, port: int, error: OSError) -> str:
    return f"--port {port}: cannot listen on {host}:{port} ({error.strerror or error})"


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = build_parser(prog) if prog else build_parser()
    args = parser.parse_args(argv)
    notes = translate_fastdeploy_values(args)
    problem = check_args(args)
    if problem is not None:
        print(f"{parser.prog}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    for note in notes + fastdeploy_flag_notes(args):
        print(f"{parser.prog}: {note}", file=sys.stderr)
    return args
