"""The `fastdeploy` command: `fastdeploy generate --model fd-tiny --mtp 1 "text"` prints the completion and a
stats line (`--pd`: on a prefill and a decode instance in this process); `fastdeploy serve ...` runs the API
server with the flags of `python -m fastdeploy.entrypoints.openai.api_server`; `fastdeploy serve --pd` runs a
router and prefill and decode servers (`--num-prefill`, `--num-decode`) on loopback
(fastdeploy/entrypoints/pd_serve.py)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from fastdeploy.config import OPS_BACKENDS
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.entrypoints.openai.fastdeploy_flags import (fastdeploy_flag_notes, fastdeploy_flags_problem,
                                                            translate_fastdeploy_values)
from fastdeploy.entrypoints.openai.serve_args import (DefaultsHelpFormatter, OneLineParser, add_precision_flags,
                                                     add_server_flags,
                                                     check_args, check_model_args)

# `fastdeploy serve` flags that only a PD deployment (--pd) takes
PD_ONLY_FLAGS = ("decode_max_num_seqs", "num_prefill", "num_decode")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="fastdeploy", description="PD + MTP serving slice: an embedded model or a checkpoint "
                                                          "directory")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="complete one prompt offline",
                                   formatter_class=DefaultsHelpFormatter)
    generate.add_argument("prompt", help="prompt text")
    generate.add_argument("--model", default="fd-tiny", metavar="NAME|PATH",
                          help="an embedded model (fd-tiny, fd-toy) or a checkpoint directory")
    generate.add_argument("--max-model-len", type=int, default=None,
                          help="prompt + output tokens (default: the model's; see `fastdeploy serve --help`)")
    generate.add_argument("--mtp", type=int, default=0, metavar="K",
                          help="MTP speculative tokens per round (0: no speculation)")
    defaults = SamplingParams()   # one definition of each default: the offline API's
    generate.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="tokens to generate at most")
    generate.add_argument("--min-tokens", type=int, default=defaults.min_tokens, help="no EOS before this many")
    generate.add_argument("--temperature", type=float, default=defaults.temperature, help="0: greedy")
    generate.add_argument("--top-p", type=float, default=defaults.top_p, help="nucleus sampling mass")
    generate.add_argument("--top-k", type=int, default=defaults.top_k, help="the k most likely tokens (0: all)")
    generate.add_argument("--min-p", type=float, default=defaults.min_p,
                          help="drop tokens below this fraction of the most likely one's probability")
    for penalty in ("repetition", "frequency", "presence"):
        generate.add_argument(f"--{penalty}-penalty", type=float, default=getattr(defaults, f"{penalty}_penalty"),
                              help="see docs/serving.md, 'Sampling controls'")
    generate.add_argument("--seed", type=int, default=defaults.seed, help="sampling seed (None: random)")
    generate.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    add_precision_flags(generate)
    generate.add_argument("--chat", action="store_true",
                          help="send the prompt as one user message through the model's chat template")
    generate.add_argument("--num-kv-blocks", type=int, default=None, help="KV blocks (see `fastdeploy serve --help`)")
    generate.add_argument("--kv-cache-memory-bytes", default=None, metavar="SIZE",
                          help="a checkpoint's KV budget, e.g. 1G (default: 4 GiB)")
    generate.add_argument("--backend", default="cpu", choices=OPS_BACKENDS, help="op backend")
    generate.add_argument("--pd", action="store_true",
                          help="disaggregated: prefill instance P hands the request to decode instance D")
    generate.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                          help="reuse the KV of full prompt blocks already computed")
    generate.set_defaults(handler=run_generate)
    serve = commands.add_parser("serve", help="run the OpenAI-compatible API server of one instance, or with --pd "
                                              "a local PD deployment (router, prefill and decode instances)",
                                formatter_class=DefaultsHelpFormatter)
    add_server_flags(serve)
    # No default in the parser, so that --pd can tell a --host given from none (fastdeploy serve: 0.0.0.0).
    serve.set_defaults(host=None)
    next(a for a in serve._actions if a.dest == "host").help = (
        "address to listen on (default: 0.0.0.0; with --pd the router's, default 127.0.0.1)")
    serve.add_argument("--pd", action="store_true",
                       help="run a local PD deployment instead: the router on --host (127.0.0.1) : --port, prefill "
                            "and decode instances on free loopback ports, restarted if they die")
    serve.add_argument("--decode-max-num-seqs", type=int, default=None, metavar="N",
                       help="with --pd: each decode instance's slots (default: 2 x --max-num-seqs, the slots of two "
                            "mixed instances: D does no prefill, so it holds more decoding requests)")
    serve.add_argument("--num-prefill", type=int, default=None, metavar="N",
                       help="with --pd: how many prefill instances (default 1)")
    serve.add_argument("--num-decode", type=int, default=None, metavar="M",
                       help="with --pd: how many decode instances (default 1)")
    serve.add_argument("--mtp", type=int, default=0, metavar="K",
                       help="shorthand for --speculative-config with MTP K (0: keep --speculative-config)")
    serve.set_defaults(handler=run_serve)
    return parser


def run_serve(args: argparse.Namespace) -> int:
    if args.mtp < 0 or (args.mtp and args.speculative_config is not None):
        print(f"fastdeploy serve: error: --mtp must be >= 0, got {args.mtp}" if args.mtp < 0 else
              "fastdeploy serve: error: --mtp and --speculative-config both set the speculative decoding; give "
              "one", file=sys.stderr)
        return 2
    if args.mtp:
        args.speculative_config = json.dumps({"method": "mtp", "num_speculative_tokens": args.mtp})
    notes = translate_fastdeploy_values(args)
    # a bad --model / --tokenizer or a FastDeploy flag that cannot apply: one line now, before any instance starts
    problem = check_model_args(args) or fastdeploy_flags_problem(args)
    if problem is not None:
        print(f"fastdeploy serve: error: {problem}", file=sys.stderr)
        return 2
    for note in notes + fastdeploy_flag_notes(args):
        print(f"fastdeploy serve: {note}", file=sys.stderr)
    if args.pd:
        if args.splitwise_role != "mixed" or args.router is not None:
            print("fastdeploy serve: error: --pd starts its own router, prefill and decode instances; drop "
                  "--splitwise-role and --router", file=sys.stderr)
            return 2
        for flag in ("decode_max_num_seqs", "num_prefill", "num_decode"):
            if getattr(args, flag) is not None and getattr(args, flag) < 1:
                print(f"fastdeploy serve: error: --{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}",
                      file=sys.stderr)
                return 2
        from fastdeploy.entrypoints.pd_serve import run_pd_deployment
        return run_pd_deployment(args)
    for flag in PD_ONLY_FLAGS:
        if getattr(args, flag) is not None:
            print(f"fastdeploy serve: error: --{flag.replace('_', '-')} needs --pd", file=sys.stderr)
            return 2
    from fastdeploy.entrypoints.openai.api_server import run_server
    if args.host is None:
        args.host = "0.0.0.0"
    problem = check_args(args)
    if problem is not None:
        print(f"fastdeploy serve: error: {problem}", file=sys.stderr)
        return 2
    # exactly the server's flags (the engine core receives them as JSON), without this parser's own fields
    flags = {k: v for k, v in vars(args).items() if k not in ("command", "handler", "pd", "mtp", *PD_ONLY_FLAGS)}
    return run_server(argparse.Namespace(**flags))


def run_generate(args: argparse.Namespace) -> int:
    problem = check_model_args(argparse.Namespace(model=args.model, tokenizer=None))
    if problem is not None:   # before Paddle loads: one line naming the path
        print(f"fastdeploy generate: error: {problem}", file=sys.stderr)
        return 2
    from fastdeploy import LLM
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                                min_tokens=args.min_tokens, stop=args.stop, seed=args.seed, top_k=args.top_k,
                                min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                                frequency_penalty=args.frequency_penalty, presence_penalty=args.presence_penalty)
    except ValueError as error:
        print(f"fastdeploy generate: error: {str(error).removeprefix('SamplingParams: ')}", file=sys.stderr)
        return 2
    spec = {"method": "mtp", "num_speculative_tokens": args.mtp} if args.mtp else None
    llm = LLM(model=args.model, speculative_config=spec, dtype=args.dtype, quantization=args.quantization,
              kv_cache_dtype=args.kv_cache_dtype,
              ops_backend=args.backend,
              max_num_seqs=1, splitwise=args.pd, enable_prefix_caching=args.enable_prefix_caching,
              max_model_len=args.max_model_len, num_kv_blocks=args.num_kv_blocks,
              kv_cache_memory_bytes=args.kv_cache_memory_bytes)
    started = time.perf_counter()
    if args.chat:
        (output,) = llm.chat([{"role": "user", "content": args.prompt}], params)
    else:
        (output,) = llm.generate(args.prompt, params)
    seconds = time.perf_counter() - started
    if output.error:
        print(f"error: {output.error}", file=sys.stderr)
        return 1
    metrics, tokens = output.metrics, len(output.outputs.token_ids)
    print(output.outputs.text)
    print(f"[{tokens} tokens, {metrics.num_decode_rounds} decode rounds, mean accept length "
          f"{metrics.mean_accept_length:.2f}, {tokens / seconds:.1f} tokens/s, finish: "
          f"{output.outputs.finish_reason}]")
    if output.pd_timings is not None:
        print(f"[PD: time to first token {_ms(output.pd_timings.time_to_first_token_s)} ms, prefill on P "
              f"{_ms(output.pd_timings.prefill_s)} ms, decode on D {_ms(output.pd_timings.decode_s)} ms]")
    return 0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # Ctrl-C before a server's own handlers are in place (it is loading): a stop
        return 0 if args.command == "serve" else 130


if __name__ == "__main__":
    sys.exit(main())
