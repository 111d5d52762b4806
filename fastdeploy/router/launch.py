"""Command line of the router: ``python -m fastdeploy.router.launch --port 9000 [--splitwise]`` (SERVICES §2).

Secrets come from the environment, never from flags that ``ps`` would show: the API key from ``FD_API_KEY`` when
``--api-key`` is not given, the registration secret from ``FD_ROUTER_SECRET`` or ``FD_PD_SECRET`` (router/auth.py).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from fastdeploy.http.sockets import DEFAULT_KEEP_ALIVE_S, listen_socket

from .auth import PD_SECRET_ENV, ROUTER_SECRET_ENV, registration_secret

log = logging.getLogger("fastdeploy.router")

# uvicorn waits this long for in-flight requests after SIGTERM/SIGINT, then cancels them (bounded drain).
DRAIN_SECS = 5
# Exit status when the router cannot listen on --host:--port: the API server's (serve_args.EXIT_CANNOT_LISTEN).
EXIT_CANNOT_LISTEN = 3


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
                        help="require 'Authorization: Bearer <key>' on /v1/* routes and /reset_prefix_cache; "
                             "without the flag FD_API_KEY is used (it keeps the key off the command line), else no "
                             "key")
    parser.add_argument("--health-interval-secs", type=_positive, default=5.0,
                        help="health-check period; instances heartbeat at the same period")
    parser.add_argument("--timeout-keep-alive", type=_positive, default=DEFAULT_KEEP_ALIVE_S, metavar="SECONDS",
                        help="close a client's keep-alive connection after it has been idle this long (above the "
                             "idle timeout of the client's connection pool)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        secret = registration_secret()
    except ValueError as exc:
        parser.error(str(exc))
    # Imported only now, so that --help and a bad flag answer without loading the web stack.
    import uvicorn

    from .router import RouterSettings, create_app

    settings = RouterSettings(host=args.host, port=args.port, splitwise=args.splitwise,
                              request_timeout_secs=args.request_timeout_secs,
                              api_key=args.api_key or os.environ.get("FD_API_KEY") or None,
                              health_interval_secs=args.health_interval_secs, registration_secret=secret)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is not a lifecycle event
    log.info("router start: %s:%d, %s mode, health interval %gs, request timeout %gs", settings.host,
             settings.port, "splitwise" if settings.splitwise else "mixed", settings.health_interval_secs,
             settings.request_timeout_secs)
    if secret is None:
        log.warning("registration is not authenticated (set %s or %s on the router and its instances); run the "
                    "router on a trusted network", ROUTER_SECRET_ENV, PD_SECRET_ENV)
    try:   # bound here: a busy or foreign address is one line, and "ready" is logged only once it listens
        sock = listen_socket(settings.host, settings.port)
    except OSError as error:
        print(f"{parser.prog}: error: --port {settings.port}: cannot listen on {settings.host}:{settings.port} "
              f"({error.strerror or error})", file=sys.stderr)
        return EXIT_CANNOT_LISTEN
    server = _server_class()(uvicorn.Config(create_app(settings), host=settings.host, port=settings.port,
                                            log_level="warning", access_log=False,
                                            timeout_graceful_shutdown=DRAIN_SECS,
                                            timeout_keep_alive=args.timeout_keep_alive),
                             ready_line=f"router ready on {settings.host}:{settings.port} "
                                        f"({'splitwise' if settings.splitwise else 'mixed'} mode)")

    def stop(signum, _frame) -> None:
        log.info("router stopping on %s", signal.Signals(signum).name)
        server.should_exit = True

    # uvicorn swaps in its own handlers while it serves and, after a graceful shutdown, re-raises the signal
    # with the handlers it found; these stop it (also in the instant before it starts) without killing the
    # process, so SIGTERM/SIGINT end in exit status 0 (SERVICES §1).
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
    server.run(sockets=[sock])
    return 0 if server.started else 1


def _server_class():
    """uvicorn's server, logging the router's "ready" line once its startup (lifespan, listening) is done; built
    here, so that --help and a bad flag answer without importing uvicorn."""
    import uvicorn

    class Server(uvicorn.Server):
        def __init__(self, config, ready_line: str):
            super().__init__(config)
            self.ready_line = ready_line

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started and not self.should_exit:
                log.info(self.ready_line)

    return Server


if __name__ == "__main__":
    sys.exit(main())
