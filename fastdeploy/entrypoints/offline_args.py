"""The flags `fastdeploy generate` and `fastdeploy chat` share (the model, the offline LLM's sizing and precision,
the sampling controls), and how they become an `LLM` and the `SamplingParams` of a request.

Sampling flags default to None: a flag given wins, else the checkpoint's generation_config.json value
(`--generation-config`, as the servers read it), else SamplingParams' own default (request > file > built-in).
"""
from __future__ import annotations

import argparse

from fastdeploy.config import OPS_BACKENDS
from fastdeploy.entrypoints.openai.serve_args import add_precision_flags
from fastdeploy.schema.sampling_params import SamplingParams

_DEFAULTS = SamplingParams()   # one definition of each built-in default: the offline API's
# (flag's field, type, help); each help says its built-in default
SAMPLING_FLAGS = (
    ("max_tokens", int, "tokens to generate at most"),
    ("min_tokens", int, "no EOS before this many"),
    ("temperature", float, "0: greedy"),
    ("top_p", float, "nucleus sampling mass"),
    ("top_k", int, "the k most likely tokens (0: all)"),
    ("min_p", float, "drop tokens below this fraction of the most likely one's probability"),
    ("repetition_penalty", float, "see docs/serving.md, 'Sampling controls'"),
    ("frequency_penalty", float, "see docs/serving.md, 'Sampling controls'"),
    ("presence_penalty", float, "see docs/serving.md, 'Sampling controls'"),
    ("seed", int, "sampling seed (default: random)"),
)
# the fields a checkpoint's generation_config.json may default (entrypoints/openai/generation_defaults.py)
_FROM_FILE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def add_offline_flags(parser: argparse.ArgumentParser) -> None:
    """The model and engine flags of an in-process LLM, and the sampling flags."""
    a = parser.add_argument
    a("--model", default="fd-tiny", metavar="NAME|PATH",
      help="an embedded model (fd-tiny, fd-toy) or a checkpoint directory")
    a("--max-model-len", type=int, default=None,
      help="prompt + output tokens (default: the model's; see `fastdeploy serve --help`)")
    a("--mtp", type=int, default=0, metavar="K", help="MTP speculative tokens per round (0: no speculation)")
    for name, kind, text in SAMPLING_FLAGS:
        builtin = getattr(_DEFAULTS, name)
        shown = "" if builtin is None else f" (default: {builtin}" + (
            ", or the checkpoint's generation_config.json)" if name in _FROM_FILE else ")")
        a(f"--{name.replace('_', '-')}", type=kind, default=None, help=text + shown)
    a("--stop", action="append", default=None, help="stop string (repeatable)")
    a("--generation-config", default="auto", metavar="auto|vllm|FOLDER",
      help="sampling defaults from the checkpoint's generation_config.json ('auto'), another folder's, or none "
           "('vllm'), as `fastdeploy serve`")
    add_precision_flags(parser)
    a("--num-kv-blocks", type=int, default=None, help="KV blocks (see `fastdeploy serve --help`)")
    a("--kv-cache-memory-bytes", default=None, metavar="SIZE",
      help="a checkpoint's KV budget, e.g. 1G (default: 4 GiB; with --pd shared by P and D)")
    a("--backend", default="cpu", choices=OPS_BACKENDS, help="op backend")
    a("--pd", action="store_true",
      help="disaggregated: prefill instance P hands the request to decode instance D")
    a("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
      help="reuse the KV of full prompt blocks already computed")
    a("--async-scheduling", action=argparse.BooleanOptionalAction, default=False,
      help="plan each engine step while the previous one computes (the same outputs)")


def build_llm(args: argparse.Namespace):
    """The in-process LLM the flags describe (one request at a time); ValueError: one line."""
    from fastdeploy import LLM   # Paddle loads here, after the flags were checked
    spec = {"method": "mtp", "num_speculative_tokens": args.mtp} if args.mtp else None
    return LLM(model=args.model, speculative_config=spec, dtype=args.dtype, quantization=args.quantization,
               kv_cache_dtype=args.kv_cache_dtype, ops_backend=args.backend, max_num_seqs=1, splitwise=args.pd,
               enable_prefix_caching=args.enable_prefix_caching, max_model_len=args.max_model_len,
               num_kv_blocks=args.num_kv_blocks, kv_cache_memory_bytes=args.kv_cache_memory_bytes,
               generation_config=args.generation_config, async_scheduling=args.async_scheduling)


def sampling_params(args: argparse.Namespace, defaults: SamplingParams) -> SamplingParams:
    """`defaults` (LLM.get_default_sampling_params()) with the flags given; ValueError names the field."""
    given = {name: getattr(args, name) for name, _, _ in SAMPLING_FLAGS if getattr(args, name) is not None}
    fields = {name: getattr(defaults, name) for name, _, _ in SAMPLING_FLAGS}
    return SamplingParams(**{**fields, **given, "stop": args.stop})
