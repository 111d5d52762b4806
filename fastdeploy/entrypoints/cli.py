"""The `fastdeploy` command: `fastdeploy generate --model fd-tiny --mtp 1 "text"` prints the completion (streamed
on a terminal) and a stats line (`--pd`: on a prefill and a decode instance in this process); `fastdeploy chat`
converses (entrypoints/chat_cli.py); `fastdeploy serve ...` runs the API
server with the flags of `python -m fastdeploy.entrypoints.openai.api_server`; `fastdeploy serve --pd` runs a
router and prefill and decode servers (`--num-prefill`, `--num-decode`) on loopback
(fastdeploy/entrypoints/pd_serve.py)."""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from fastdeploy.entrypoints.offline_args import add_offline_flags, build_llm, sampling_params
from fastdeploy.entrypoints.openai.fastdeploy_flags import (fastdeploy_flag_notes, fastdeploy_flags_problem,
                                                            translate_fastdeploy_values)
from fastdeploy.entrypoints.openai.serve_args import (DefaultsHelpFormatter, OneLineParser, add_server_flags,
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
    add_offline_flags(generate)
    generate.add_argument("--chat", action="store_true",
                          help="send the prompt as one user message through the model's chat template")
    generate.set_defaults(handler=run_generate)
    chat = commands.add_parser("chat", help="chat with a model in this terminal: history, its chat template, "
                                            "streamed replies (/exit or EOF ends it)",
                               formatter_class=DefaultsHelpFormatter)
    add_offline_flags(chat)
    chat.add_argument("--system", default=None, help="a system message that opens the conversation")
    chat.add_argument("--chat-template", default=None, metavar="FILE",
                      help="a Jinja chat template instead of the model's own")
    chat.set_defaults(handler=run_chat)
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
    return run_server(argparse.Namespace(**flags), prog="fastdeploy serve")


def run_generate(args: argparse.Namespace) -> int:
    problem = check_model_args(argparse.Namespace(model=args.model, tokenizer=None))
    if problem is not None:   # before Paddle loads: one line naming the path
        return fail("generate", problem)
    llm = build_llm(args)
    params = sampling_params(args, llm.get_default_sampling_params())
    prompt = llm.chat_prompts([{"role": "user", "content": args.prompt}])[0] if args.chat else args.prompt
    started = time.perf_counter()
    if sys.stdout.isatty():   # a person watches: the text as it comes
        stream = llm.stream(prompt, params)
        for piece in stream:
            print(piece, end="", flush=True)
        print()
        output = stream.output
    else:                     # a pipe or a file: the whole text at once
        (output,) = llm.generate(prompt, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    if output.error:
        return fail("generate", output.error, status=1)
    if not sys.stdout.isatty():
        print(output.outputs.text)
    metrics, tokens = output.metrics, len(output.outputs.token_ids)
    print(f"[{tokens} tokens, {metrics.num_decode_rounds} decode rounds, mean accept length "
          f"{metrics.mean_accept_length:.2f}, {tokens / seconds:.1f} tokens/s, finish: "
          f"{output.outputs.finish_reason}]")
    if output.pd_timings is not None:
        print(f"[PD: time to first token {_ms(output.pd_timings.time_to_first_token_s)} ms, prefill on P "
              f"{_ms(output.pd_timings.prefill_s)} ms, decode on D {_ms(output.pd_timings.decode_s)} ms]")
    return 0


def run_chat(args: argparse.Namespace) -> int:
    problem = check_model_args(argparse.Namespace(model=args.model, tokenizer=None))
    if problem is not None:
        return fail("chat", problem)
    from fastdeploy.entrypoints.chat_cli import chat_loop
    llm = build_llm(args)
    params = sampling_params(args, llm.get_default_sampling_params())
    return chat_loop(llm, params, args.system, args.chat_template)


def fail(command: str, message: str, status: int = 2) -> int:
    """The one-line error every `fastdeploy` command prints: `fastdeploy COMMAND: error: ...` (argparse's form)."""
    print(f"fastdeploy {command}: error: {message.removeprefix('SamplingParams: ')}", file=sys.stderr)
    return status


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGINT, _interrupt_once)
    try:
        return args.handler(args)
    except ValueError as error:
        return fail(args.command, str(error))
    except KeyboardInterrupt:   # Ctrl-C before a server's own handlers are in place (it is loading): a stop
        return 0 if args.command == "serve" else 130


def _interrupt_once(signum, frame) -> None:
    """Ctrl-C: KeyboardInterrupt, once. Further Ctrl-Cs while it unwinds (Paddle, the engine core's shutdown) are
    ignored, so that they print no second traceback ("During handling of the above exception ..."); the servers
    and `fastdeploy chat` install their own handlers once they run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
