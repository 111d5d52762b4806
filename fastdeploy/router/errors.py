"""OpenAI-style error objects as the router sends them: JSON responses and mid-stream SSE error events."""
from __future__ import annotations

import json

from fastapi.responses import JSONResponse

# The instances' API server uses the same names for the statuses both can send.
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error", 502: "bad_gateway",
          503: "service_unavailable", 504: "gateway_timeout"}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """The body ``{"error": {message, type, param, code}}`` of SERVICES §3, with the HTTP status as ``code``."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    """A JSON error response with the given status."""
    return JSONResponse(error_body(status, message, param), status_code=status)


def sse_error_event(status: int, message: str) -> bytes:
    """The error chunk sent when a stream fails after it started (SERVICES §3); the stream closes after it."""
    return b"data: " + json.dumps(error_body(status, message)).encode() + b"\n\n"
