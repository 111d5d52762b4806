"""The API server of one instance: an OpenAI-compatible FastAPI app on uvicorn in front of an engine core
process (SERVICES §1, §3).

`python -m fastdeploy.entrypoints.openai.api_server --model fd-tiny --port 8180` (or `fastdeploy serve ...`).
The app starts the engine core in its lifespan and answers `/health` 503 until the core reports ready; SIGTERM
stops accepting connections, lets in-flight requests finish for `--drain-timeout-s` (those still running then end
with an error naming the shutdown), stops the core and exits 0.
If the engine core dies (crash, OOM kill, SIGKILL, no heartbeat) `/health` answers 503 at once, every in-flight
request ends with an error, and the server exits with status 1 within a few seconds, so that a supervisor
(`fastdeploy serve --pd`, systemd, Kubernetes) restarts the instance (docs/serving.md "Supervision").
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import signal
import sys
import time

if __name__ == "__main__":   # Ctrl-C while the imports below load is a stop (status 0), not a traceback
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, start_http_server
from starlette.exceptions import HTTPException as StarletteHTTPException

from fastdeploy.engine.core_client import EngineCoreClient, EngineDeadError
from fastdeploy.entrypoints.chat_template import ChatTemplate, chat_template_for
from fastdeploy.entrypoints.openai import sglang_compat
from fastdeploy.entrypoints.openai.generation_defaults import sampling_defaults
from fastdeploy.entrypoints.openai.advertise import advertise_problem, advertise_warning, advertised_host
from fastdeploy.entrypoints.openai.errors import APIError
from fastdeploy.entrypoints.openai.header_limits import HeaderLimits
from fastdeploy.entrypoints.openai.registration import heartbeat_load, keep_registered, package_version, registration
from fastdeploy.entrypoints.openai.serve_args import (EXIT_CANNOT_LISTEN, SERVER_PROG, build_parser, cannot_listen,
                                                      config_from_args, model_aliases, parse_args, served_model_names)
from fastdeploy.entrypoints.openai.serving_chat import create_chat_completion
from fastdeploy.entrypoints.openai.serving_completion import create_completion
from fastdeploy.entrypoints.openai.serving_engine import OpenAIServing, ServingSettings
from fastdeploy.entrypoints.openai.serving_tokenize import detokenize, tokenize
from fastdeploy.http.sockets import listen_socket
from fastdeploy.metrics.metrics import ServerMetrics
from fastdeploy.model_executor.models.tokenizer import get_tokenizer
from fastdeploy.router.auth import registration_secret

logger = logging.getLogger("fastdeploy.api_server")

# The engine core builds its instance with this function (imported there, never here: it loads Paddle).
ENGINE_BUILDER = "fastdeploy.entrypoints.instance_builder:build_instance"
# uvicorn's h11 parser buffers at most this much of a request line + headers still arriving (400 beyond)
H11_MAX_INCOMPLETE_BYTES = 64 * 1024
STARTED_AT = int(time.time())   # /v1/models' `created`: when this server started
# FastDeploy's variable for the API key: a key given here stays off the command line (`ps` shows argv).
API_KEY_ENV = "FD_API_KEY"
# After the engine core died: the in-flight requests' errors go out first, then the server stops accepting and
# exits; open connections get at most this long more before they are closed.
CORE_DEATH_EXIT_S = 0.5
CORE_DEATH_FORCE_S = 3.0
# After --drain-timeout-s the requests still in flight end with an error naming the shutdown; uvicorn gets this
# much longer to send those errors before it cancels what is left.
DRAIN_GRACE_S = 2.0

__all__ = ["build_app", "build_parser", "main"]


def build_app(args: argparse.Namespace, builder: str = ENGINE_BUILDER) -> FastAPI:
    metrics = ServerMetrics(args.splitwise_role)

    def core_died(reason: str) -> None:
        metrics.forget_submitted()
        if app.state.draining:   # e.g. SIGTERM to the whole process group: a shutdown, not a failure
            logger.info("shutdown: the engine core exited while draining (%s)", reason)
            return
        app.state.core_dead = reason
        if app.state.on_core_death is not None:
            app.state.on_core_death(reason)

    client = EngineCoreClient(builder, vars(args), heartbeat_timeout_s=args.heartbeat_timeout_s,
                              step_timeout_s=args.step_timeout_s,
                              on_outputs=metrics.on_outputs, on_submit=metrics.on_submit, on_dead=core_died)
    tokenizer = get_tokenizer(args.tokenizer or args.model)   # ValueError of one line: run_server reports it
    serving = OpenAIServing(client, tokenizer, _chat_template(args, tokenizer), metrics, _settings(args))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await client.start()
        waiter = asyncio.create_task(_log_ready(client, args, serving))
        try:
            yield
        finally:
            waiter.cancel()
            await client.shutdown()

    app = FastAPI(title="FastDeploy PD + MTP", lifespan=lifespan)
    app.state.serving = serving
    app.state.draining = False
    app.state.core_dead = None          # why the engine core died, once it has
    app.state.on_core_death = None      # run_server: stop the server (exit status 1)
    _add_cors(app, args)
    app.add_middleware(HeaderLimits)
    _add_error_handlers(app)
    authorize = _authorizer(args.api_key)
    _add_generation_routes(app, serving, authorize)
    _add_info_routes(app, client)
    _add_sglang_probes(app, args, serving)
    _add_prefix_cache_route(app, client, authorize)
    if args.metrics_port is None or args.metrics_port == args.port:
        @app.get("/metrics")
        async def prometheus():
            return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
    else:
        app.state.metrics_port = args.metrics_port
    app.state.metrics = metrics
    return app


def _settings(args: argparse.Namespace) -> ServingSettings:
    """max_model_len as the flags resolve it (a checkpoint's comes from its config.json and the KV budget); the
    engine core's Ready reports the value it runs with, which replaces it (`_log_ready`)."""
    return ServingSettings(model_names=served_model_names(args), role=args.splitwise_role,
                           max_model_len=config_from_args(args).scheduler.max_model_len,
                           max_concurrency=args.max_concurrency, max_body_bytes=args.max_body_bytes,
                           model_aliases=model_aliases(args),
                           sampling_defaults=sampling_defaults(args.model, args.generation_config))


def _chat_template(args: argparse.Namespace, tokenizer) -> ChatTemplate | None:
    """--chat-template, else the checkpoint's own template, else the built-in one (embedded models); None: a
    checkpoint without one, whose chat requests are refused."""
    return chat_template_for(tokenizer, args.chat_template)


def _authorizer(api_key: str | None):
    """The check of `Authorization: Bearer <key>` on the /v1 routes and the admin route (`/reset_prefix_cache`);
    none without --api-key. Probes (/health, /ping, /version, /metrics, the SGLang info routes) stay open."""

    def authorize(raw: Request) -> None:
        if api_key is None:
            return
        given = raw.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(errors="replace"), f"Bearer {api_key}".encode()):
            raise APIError(401, "missing or wrong API key (Authorization: Bearer <key>)")

    return authorize


def _add_cors(app: FastAPI, args: argparse.Namespace) -> None:
    """--allowed-origins: Starlette's CORS middleware (no CORS headers at all without the flag)."""
    if args.allowed_origins is not None:
        app.add_middleware(CORSMiddleware, allow_origins=args.allowed_origins, allow_methods=args.allowed_methods,
                           allow_headers=args.allowed_headers, allow_credentials=args.allow_credentials)


def _add_error_handlers(app: FastAPI) -> None:
    """Errors raised by routes and by the HTTP layer (404, 405) become OpenAI error objects."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError):
        return error.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException):
        return APIError(error.status_code, str(error.detail)).response()


def _add_generation_routes(app: FastAPI, serving: OpenAIServing, authorize) -> None:
    @app.post("/v1/completions")
    async def completions(raw: Request):
        authorize(raw)
        return await create_completion(serving, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request):
        authorize(raw)
        return await create_chat_completion(serving, raw)

    @app.get("/v1/models")
    async def models(raw: Request):
        authorize(raw)
        return {"object": "list", "data": [_model_card(name, serving) for name in serving.settings.model_names]}

    # vLLM serves these outside /v1 and without the API key; so does this server
    @app.post("/tokenize")
    async def tokenize_route(raw: Request):
        return await tokenize(serving, raw)

    @app.post("/detokenize")
    async def detokenize_route(raw: Request):
        return await detokenize(serving, raw)


def _model_card(name: str, serving: OpenAIServing) -> dict:
    return {"id": name, "object": "model", "created": STARTED_AT, "owned_by": "fastdeploy",
            "root": serving.settings.model_names[0], "parent": None,
            "max_model_len": serving.settings.max_model_len}


def _add_info_routes(app: FastAPI, client: EngineCoreClient) -> None:
    @app.get("/health")
    async def health():
        if client.is_ready and not app.state.draining:
            return {"status": "ok"}
        state = "draining" if app.state.draining else (client.dead_reason or client.state)
        return APIError(503, f"not ready: {state}").response()

    @app.get("/ping")
    async def ping():
        return {"status": "alive"}

    @app.get("/version")
    async def version():
        return {"version": package_version()}


def _add_prefix_cache_route(app: FastAPI, client: EngineCoreClient, authorize) -> None:
    """vLLM's `POST /reset_prefix_cache`: the engine core drops every cached KV block no request references. An
    admin route: behind --api-key (anyone reaching the port could otherwise flush every tenant's cache)."""

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(raw: Request):
        authorize(raw)
        try:
            dropped = await client.reset_prefix_cache()
        except EngineDeadError as error:
            return APIError(503, f"not ready: {error}").response()
        return {"status": "ok", "num_dropped_blocks": dropped}


def _add_sglang_probes(app: FastAPI, args: argparse.Namespace, serving: OpenAIServing) -> None:
    """What sglang-router reads of an instance when it adds it (docs/serving.md, "Endpoints"); open like /health,
    and under SGLang's older `get_` names too."""

    async def server_info():
        return sglang_compat.server_info(args, serving.model_name, serving.client.ready_info, package_version())

    async def model_info():
        return sglang_compat.model_info()

    for path, route in (("server_info", server_info), ("model_info", model_info)):
        app.add_api_route(f"/{path}", route, methods=["GET"])
        app.add_api_route(f"/get_{path}", route, methods=["GET"])


def http_options(args: argparse.Namespace) -> dict:
    """uvicorn settings of the HTTP layer (docs/serving.md, "Limits"): TLS when --ssl-* is given, the h11 parser,
    which bounds what it buffers of headers still arriving (httptools buffers without bound), and how long an idle
    keep-alive connection stays open (fastdeploy/http/sockets.py)."""
    return {"http": "h11", "h11_max_incomplete_event_size": H11_MAX_INCOMPLETE_BYTES,
            "ssl_keyfile": args.ssl_keyfile, "ssl_certfile": args.ssl_certfile,
            "timeout_keep_alive": args.timeout_keep_alive}


async def _log_ready(client: EngineCoreClient, args: argparse.Namespace, serving: OpenAIServing) -> None:
    if await client.wait_ready():
        serving.settings.max_model_len = client.ready_info.get("max_model_len", serving.settings.max_model_len)
        logger.info("ready: serving %s as %s on http://%s:%d (max_model_len %d)", args.model, serving.model_name,
                    args.host, args.port, serving.settings.max_model_len)
        if args.router is not None:
            await keep_registered(args.router, registration(args, client.ready_info),
                                  args.health_interval_secs, lambda: heartbeat_load(client.stats))


class _Server(uvicorn.Server):
    """uvicorn's server, with /health turning 503 as soon as a shutdown signal arrives (draining), and stopping
    on its own when the engine core dies."""

    def __init__(self, config: uvicorn.Config, app: FastAPI):
        super().__init__(config)
        self.fd_app = app
        app.state.on_core_death = self.exit_after_core_death

    def exit_after_core_death(self, reason: str) -> None:
        """Called in the event loop: stop soon (exit status 1), whatever the drain timeout says."""
        logger.error("shutdown: the engine core is gone (%s); exiting with status 1 so that a supervisor restarts "
                     "this instance", reason)
        loop = asyncio.get_running_loop()
        loop.call_later(CORE_DEATH_EXIT_S, setattr, self, "should_exit", True)
        loop.call_later(CORE_DEATH_FORCE_S, setattr, self, "force_exit", True)

    def handle_exit(self, sig, frame) -> None:
        if self.fd_app.state.draining:
            # A second Ctrl-C: uvicorn would force its exit, cancelling the lifespan mid-shutdown (a traceback in
            # the log); the drain ends now instead, and the shutdown goes on as after the drain timeout.
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:   # the loop has ended: nothing is in flight
                return
            logger.info("shutdown: signal %d again, ending the requests in flight now", sig)
            loop.call_soon_threadsafe(self._end_in_flight)
            return
        logger.info("shutdown: signal %d, draining for up to %g s", sig, self.drain_timeout_s)
        self.fd_app.state.draining = True
        super().handle_exit(sig, frame)

    @property
    def drain_timeout_s(self) -> float:
        return self.config.timeout_graceful_shutdown - DRAIN_GRACE_S

    async def shutdown(self, sockets=None) -> None:
        """uvicorn's shutdown, with the requests still in flight at the drain timeout ended by an error that names
        it (a stream's last event, a non-streamed request's 503) rather than cut off."""
        ender = asyncio.get_running_loop().call_later(self.drain_timeout_s, self._end_in_flight)
        try:
            await super().shutdown(sockets)
        finally:
            ender.cancel()

    def _end_in_flight(self) -> None:
        client = self.fd_app.state.serving.client
        reason = f"the server is shutting down: --drain-timeout-s ({self.drain_timeout_s:g} s) passed"
        count = client.end_in_flight(reason)
        if count:
            logger.warning("shutdown: %s; %d request(s) in flight end with an error", reason, count)


def run_server(args: argparse.Namespace, builder: str = ENGINE_BUILDER, prog: str = SERVER_PROG) -> int:
    """Serve until SIGTERM/SIGINT (exit status 0) or until the engine core dies (status 1). `builder` names the
    engine core's instance builder (tests wrap the real one); a refusal at start is one line `PROG: error: ...`,
    as the flags' own errors (`fastdeploy serve` passes its name)."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: with a router that is a line per heartbeat, not a lifecycle event.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.api_key is None and os.environ.get(API_KEY_ENV):
        args.api_key = os.environ[API_KEY_ENV]
    if args.router is not None:
        try:
            registration_secret()
        except ValueError as error:
            print(f"{prog}: error: {error}", file=sys.stderr)
            return 2
    if args.router is not None or args.splitwise_role != "mixed":
        # resolved once, here: the registration, P/D connector and Mooncake segment all advertise this address
        advertised = advertised_host(args)
        problem = advertise_problem(args, advertised)
        if problem is not None:
            print(f"{prog}: error: {problem}", file=sys.stderr)
            return 2
        warning = advertise_warning(args, advertised)
        if warning is not None:
            logger.warning("start: %s", warning)
        args.advertise_host = advertised
    try:   # bound before anything starts (the engine core loads for seconds): a busy port is one line at once
        listener = listen_socket(args.host, args.port)
    except OSError as error:
        print(f"{prog}: error: {cannot_listen(args.host, args.port, error)}", file=sys.stderr)
        return EXIT_CANNOT_LISTEN
    try:
        app = build_app(args, builder)
    except ValueError as error:   # the tokenizer or the checkpoint's chat template (one line naming the file)
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    if getattr(app.state, "metrics_port", None) is not None:
        start_http_server(args.metrics_port, addr=args.host, registry=app.state.metrics.registry)
    logger.info("start: api server for %s on %s:%d (role %s)", args.model, args.host, args.port, args.splitwise_role)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.drain_timeout_s + DRAIN_GRACE_S, access_log=False,
                            **http_options(args))
    # uvicorn re-raises the shutdown signal once it has shut down gracefully, through the handlers it found at
    # start; SERVICES §1 wants exit status 0 after a drain, so the handlers it finds are no-ops.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _ignore_signal)
    _Server(config, app).run(sockets=[listener])
    status = 0 if app.state.core_dead is None else 1
    logger.info("shutdown: done (status %d)", status)
    return status


def _ignore_signal(sig, frame) -> None:
    """Stands in for the default action of a signal uvicorn re-raises after its graceful shutdown."""


def main(argv: list[str] | None = None) -> int:
    return run_server(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
