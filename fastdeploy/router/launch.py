"""Command line of the router: ``python -m fastdeploy.router.launch --port 9000 [--splitwise]`` (SERVICES §2)."""
from __future__ import annotations

import argparse
import logging
import signal
import sys

import uvicorn

from .router import RouterSettings, create_app

log = logging.getLogger("fastdeploy.router")

# uvicorn waits this long for in-flight requests after SIGTERM/SIGINT, then cancels them (bounded drain).
DRAIN_SECS = 5


class _OneLineParser(argparse.ArgumentParser):
    """Reports a bad flag in one line and exits 2 (SERVICES §2), instead of argparse's usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def _port(value: str) -> int:
    number = int(value)
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 1..65535, got {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m fastdeploy.router.launch",
                            description="Router for FastDeploy instances: balances mixed instances, or pairs a "
                                        "prefill with a decode instance (--splitwise).",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=_port, default=9000, help="port to listen on")
    parser.add_argument("--splitwise", action="store_true",
                        help="pair a prefill with a decode instance (equal config hashes) for each request; "
                             "without it, balance mixed instances")
    parser.add_argument("--request-timeout-secs", type=_positive, default=600.0,
                        help="bound on each request to an instance, streaming included")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer <key>' on /v1/* routes")
    parser.add_argument("--health-interval-secs", type=_positive, default=5.0,
                        help="health-check period; instances heartbeat at the same period")
    return parser


def _note_signal(signum, _frame) -> None:
    log.info("router stopping on signal %s", signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = RouterSettings(host=args.host, port=args.port, splitwise=args.splitwise,
                              request_timeout_secs=args.request_timeout_secs, api_key=args.api_key,
                              health_interval_secs=args.health_interval_secs)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is not a lifecycle event
    log.info("router start: %s:%d, %s mode, health interval %gs, request timeout %gs", settings.host,
             settings.port, "splitwise" if settings.splitwise else "mixed", settings.health_interval_secs,
             settings.request_timeout_secs)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host=settings.host, port=settings.port,
                                           log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=DRAIN_SECS))
    # After a graceful shutdown uvicorn re-raises the signal that stopped it with the handlers it found at
    # start; with these in place that only logs, so SIGTERM/SIGINT end in exit status 0 (SERVICES §1).
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _note_signal)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
