"""The router's FastAPI application: registration, health, metrics and the OpenAI routes (SERVICES §5)."""
from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections import Counter as Tally
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from fastdeploy.http.json_body import BodyError, parse_object, read_body

from .auth import RegistrationAuthError, RegistrationVerifier
from .errors import error_body, error_response
from .forward import Forwarder
from .health import HealthMonitor, health_client
from .metrics import RouterMetrics
from .protocol import ROLES, Registration, unreachable_field
from .registry import SUCCESSES_TO_HEALTHY, NoHealthyTargetError, Registry, UnknownModelError

log = logging.getLogger("fastdeploy.router")

# A completion body is a prompt plus a few fields; anything larger is refused before it is buffered (413).
MAX_BODY_BYTES = 8 * 1024 * 1024
# Reaching an instance is quick on any network the router serves; the request timeout bounds the rest.
CONNECT_TIMEOUT_SECS = 5.0
# Upstream headers worth forwarding; hop-by-hop ones and Content-Length are httpx's business.
_FORWARDED_HEADERS = ("authorization", "accept", "user-agent")
# A registration is a few hundred bytes.
MAX_REGISTRATION_BYTES = 64 * 1024


@dataclass(slots=True)
class RouterSettings:
    """The router's flags (SERVICES §2), validated."""

    host: str = "0.0.0.0"
    port: int = 9000
    splitwise: bool = False
    request_timeout_secs: float = 600.0
    api_key: str | None = None
    health_interval_secs: float = 5.0
    # FD_ROUTER_SECRET, else FD_PD_SECRET (router/auth.py): heartbeats must be signed with it; None: open.
    registration_secret: bytes | None = None

    def __post_init__(self):
        if not 1 <= self.port <= 65535:
            raise ValueError(f"RouterSettings: field 'port' must be in 1..65535, got {self.port}")
        if not self.request_timeout_secs > 0:
            raise ValueError("RouterSettings: field 'request_timeout_secs' must be > 0, "
                             f"got {self.request_timeout_secs}")
        if not self.health_interval_secs > 0:
            raise ValueError("RouterSettings: field 'health_interval_secs' must be > 0, "
                             f"got {self.health_interval_secs}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("RouterSettings: field 'api_key' must not be empty")
        if self.registration_secret is not None and not self.registration_secret:
            raise ValueError("RouterSettings: field 'registration_secret' must not be empty")


class BadBody(Exception):
    """The client's body is not something the router can forward (4xx naming the field)."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


async def _read_body(request: Request) -> tuple[bytes, dict]:
    """The raw body and its JSON object, under the API server's limits (fastdeploy/http/json_body.py); the router
    needs ``model`` and adds ``disaggregate_info``."""
    try:
        raw = await read_body(request, MAX_BODY_BYTES, "the router's limit")
        body = parse_object(raw)
    except BodyError as error:
        raise BadBody(error.status, error.message, error.param) from None
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise BadBody(400, "field 'model' must be a string", "model")
    if "disaggregate_info" in body:
        raise BadBody(400, "field 'disaggregate_info' is set by the router, not by clients", "disaggregate_info")
    return bytes(raw), body


def _forwarded_headers(request: Request) -> dict[str, str]:
    headers = {name: request.headers[name] for name in _FORWARDED_HEADERS if name in request.headers}
    headers["content-type"] = "application/json"
    return headers


def create_app(settings: RouterSettings) -> FastAPI:
    """The router application; its lifespan owns the HTTP client, the health monitor and in-flight requests."""
    registry = Registry(settings.health_interval_secs)
    metrics = RouterMetrics(registry)
    state: dict[str, Forwarder | httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        timeout = httpx.Timeout(None, connect=min(CONNECT_TIMEOUT_SECS, settings.request_timeout_secs))
        # No pool limit: an instance's own --max-concurrency (429) is the admission control. No idle connections
        # kept either: a request sent on a kept-alive connection to an instance sometimes failed before any answer
        # (httpx ReadError, a 502 "broken"; the PD soak test, run three at a time: 5 failures in 30 runs, then none
        # in 18 with a fresh connection per request); a loopback or LAN connect costs far less than any request.
        # The likely cause, found later: the instance's keep-alive timer (then uvicorn's 5 s) runs from when it has
        # sent a response, the pool's idle clock from when the router has relayed it, so a slow relay left the
        # router reusing connections the instance was closing (now the instances keep them 120 s,
        # fastdeploy/http/sockets.py).
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client, health_client() as checks:
            state["client"] = client
            state["forwarder"] = forwarder = Forwarder(registry, client, metrics, settings.request_timeout_secs,
                                                      settings.health_interval_secs)
            monitor = asyncio.create_task(HealthMonitor(registry, checks, settings.health_interval_secs).run())
            try:
                yield
            finally:
                monitor.cancel()
                cancelled = await forwarder.close()
                log.info("router shutdown: %d upstream requests cancelled", cancelled)

    app = FastAPI(title="fastdeploy router", lifespan=lifespan)
    app.state.registry = registry

    _add_error_handlers(app, metrics, retry_after_s(settings.health_interval_secs))
    _add_registration_routes(app, registry, settings)
    _add_generation_routes(app, registry, metrics, settings, state)
    return app


def retry_after_s(health_interval_secs: float) -> int:
    """Retry-After of a 503 for want of a healthy instance: the time a restarted instance needs to pass the
    health checks that make it healthy again."""
    return max(1, math.ceil(SUCCESSES_TO_HEALTHY * health_interval_secs))


def _add_error_handlers(app: FastAPI, metrics: RouterMetrics, retry_after: int) -> None:
    """Every refusal becomes an OpenAI error object; the router's own refusals are counted by reason."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"][1:]) or None
        return error_response(400, f"field '{field}': {first['msg']}" if field else first["msg"], field)

    @app.exception_handler(HTTPException)
    async def _http_error(_request: Request, exc: HTTPException):
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(BadBody)
    async def _bad_body(_request: Request, exc: BadBody):
        metrics.refused.labels("bad_request").inc()
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(UnknownModelError)
    async def _unknown_model(_request: Request, exc: UnknownModelError):
        metrics.refused.labels("unknown_model").inc()
        return error_response(404, str(exc), "model")

    @app.exception_handler(NoHealthyTargetError)
    async def _no_target(_request: Request, exc: NoHealthyTargetError):
        metrics.refused.labels("no_healthy_target").inc()
        response = error_response(503, str(exc))
        response.headers["Retry-After"] = str(retry_after)
        return response


def _add_generation_routes(app: FastAPI, registry: Registry, metrics: RouterMetrics, settings: RouterSettings,
                           state: dict) -> None:
    """``/v1/completions``, ``/v1/chat/completions``, ``/v1/models`` (behind ``--api-key``), ``/metrics``, and
    ``/tokenize``, ``/detokenize``, ``/version`` (an instance's answer)."""

    # async: FastAPI would run a plain function in its thread pool, a thread hop on every request
    async def require_api_key(authorization: str | None = Header(default=None)) -> None:
        if settings.api_key is None:
            return
        expected = f"Bearer {settings.api_key}"
        if authorization is None or not secrets.compare_digest(authorization.encode(), expected.encode()):
            raise HTTPException(401, "missing or wrong API key: send 'Authorization: Bearer <key>'")

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(generate_latest(metrics.prometheus), media_type=CONTENT_TYPE_LATEST)

    async def to_one_instance(request: Request, path: str) -> Response:
        """Routes every instance answers alike (the same model, tokenizer and chat template): one decode (or
        mixed) instance answers them, its 4xx passed through, its failure a 502."""
        instance = registry.choose("decode" if settings.splitwise else "mixed", None)
        content = None
        if request.method == "POST":
            try:
                content = bytes(await read_body(request, MAX_BODY_BYTES, "the router's limit"))
            except BodyError as error:
                raise BadBody(error.status, error.message, error.param) from None
        try:
            answer = await state["client"].request(request.method, f"{instance.url}{path}", content=content,
                                                   headers=_forwarded_headers(request),
                                                   timeout=settings.request_timeout_secs)
        except httpx.HTTPError as exc:
            return error_response(502, f"instance {instance.key}: {exc or type(exc).__name__}")
        if answer.status_code >= 500:
            return error_response(502, f"instance {instance.key} answered {answer.status_code}")
        return Response(answer.content, answer.status_code,
                        media_type=answer.headers.get("content-type", "application/json"))

    @app.get("/v1/models", dependencies=[Depends(require_api_key)])
    async def models(request: Request):
        return await to_one_instance(request, "/v1/models")

    # open as on the instances (vLLM's /tokenize, /detokenize and /version are not under /v1)
    @app.post("/tokenize")
    async def tokenize(request: Request):
        return await to_one_instance(request, "/tokenize")

    @app.post("/detokenize")
    async def detokenize(request: Request):
        return await to_one_instance(request, "/detokenize")

    @app.get("/version")
    async def version(request: Request):
        return await to_one_instance(request, "/version")

    @app.post("/reset_prefix_cache", dependencies=[Depends(require_api_key)])
    async def reset_prefix_cache(request: Request):
        """vLLM's endpoint, fanned out: every registered instance (P and D each keep their own prefix cache)
        drops its cached blocks; the answer lists each instance's result, 502 if any failed."""
        instances = registry.instances()
        if not instances:
            return error_response(503, "no instance is registered")
        headers = {name: request.headers[name] for name in ("authorization",) if name in request.headers}
        results = await asyncio.gather(*(_reset_one(state["client"], instance, headers,
                                                    settings.request_timeout_secs) for instance in instances))
        failed = [row for row in results if row.get("status") != "ok"]
        log.info("reset_prefix_cache: %d of %d instances reset", len(results) - len(failed), len(results))
        return JSONResponse({"status": "failed" if failed else "ok", "instances": results},
                            status_code=502 if failed else 200)

    async def completion(request: Request, path: str) -> Response:
        raw, body = await _read_body(request)
        forwarder: Forwarder = state["forwarder"]
        if settings.splitwise:
            return await forwarder.splitwise(request, path, raw, body, _forwarded_headers(request))
        return await forwarder.mixed(request, path, raw, body, _forwarded_headers(request))

    @app.post("/v1/completions", dependencies=[Depends(require_api_key)])
    async def completions(request: Request):
        return await completion(request, "/v1/completions")

    @app.post("/v1/chat/completions", dependencies=[Depends(require_api_key)])
    async def chat_completions(request: Request):
        return await completion(request, "/v1/chat/completions")


async def _reset_one(client: httpx.AsyncClient, instance, headers: dict[str, str], timeout_s: float) -> dict:
    """One instance's `POST /reset_prefix_cache`: its own answer, or the error that kept it from answering."""
    row = {"instance": instance.key, "role": instance.role}
    try:
        answer = await client.post(f"{instance.url}/reset_prefix_cache", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return {**row, "status": "failed", "error": f"unreachable: {str(exc) or type(exc).__name__}"}
    try:
        body = answer.json()
    except ValueError:
        body = None
    if answer.status_code == 200 and isinstance(body, dict):
        return {**row, "status": body.get("status"), "num_dropped_blocks": body.get("num_dropped_blocks")}
    message = body["error"].get("message") if isinstance(body, dict) and isinstance(body.get("error"), dict) \
        else answer.text[:200]
    return {**row, "status": "failed", "error": f"answered {answer.status_code}: {message}"}


def _add_registration_routes(app: FastAPI, registry: Registry, settings: RouterSettings) -> None:
    """``/register`` (the heartbeat, signed when the router has a secret), ``/registered`` and ``/health``."""
    verifier = None if settings.registration_secret is None else RegistrationVerifier(settings.registration_secret)

    @app.post("/register")
    async def register(request: Request):
        # the signature headers first, then the body streamed under its limit, then the signature over it
        try:
            if verifier is not None:
                verifier.check_headers(request.headers)
            body = await read_body(request, MAX_REGISTRATION_BYTES, "the registration limit")
            if verifier is not None:
                verifier.verify(request.headers, body)
        except RegistrationAuthError as exc:
            log.warning("registration refused from %s: %s", request.client.host if request.client else "?", exc)
            return error_response(401, str(exc))
        except BodyError as exc:
            return error_response(exc.status, exc.message)
        try:
            registration = Registration.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or None
            return error_response(400, f"field '{field}': {first['msg']}" if field else first["msg"], field)
        sender = request.client.host if request.client else None
        field = unreachable_field(registration, sender)
        if field is not None:   # SERVICES §5: an address only the instance's own host can use
            message = (f"field '{field}': {getattr(registration, field)!r} is a loopback or wildcard address, which "
                       f"reaches only the instance's own host, and it registers from {sender}; start it with a "
                       f"reachable --host or --advertise-host")
            log.warning("registration refused: %s", message)
            return error_response(400, message, field)
        change = registry.register(registration)
        if change == "refreshed":
            log.debug("heartbeat from %s", registration.key)
        else:
            log.info("instance %s: %s (%s, model %s, config_hash %s, connector %s)",
                     "registered" if change == "new" else "re-registered with a new description",
                     registration.key, registration.role, registration.model, registration.config_hash,
                     registration.connector_addr)
        return {"status": "ok", "instance": registration.key}

    @app.get("/registered")
    async def registered():
        return {"splitwise": settings.splitwise, "instances": registry.describe()}

    @app.get("/health")
    async def health():
        """200 only while a request could be served now: a healthy mixed instance, or in splitwise mode a
        healthy P and D with equal config hashes (SERVICES §5); 503 naming what is missing otherwise."""
        instances = registry.instances()
        healthy = Tally(inst.role for inst in instances if inst.healthy)
        body = {"splitwise": settings.splitwise, "instances": len(instances),
                "healthy": {role: healthy.get(role, 0) for role in ROLES}}
        try:
            if settings.splitwise:
                registry.choose_pair(None)
            else:
                registry.choose("mixed", None)
        except NoHealthyTargetError as exc:
            return JSONResponse({**error_body(503, f"cannot serve: {exc}"), "status": "unavailable", **body},
                                status_code=503)
        return {"status": "ok", **body}
