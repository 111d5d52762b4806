"""Refuses HTTP requests whose headers exceed the documented bounds (docs/serving.md, "Limits"), before any route
runs, with an OpenAI error object (431).

uvicorn's h11 parser bounds only headers that arrive incomplete; a header block sent in one piece reaches the app
whole, whatever its size, so the bound that clients can rely on is this one.
"""
from __future__ import annotations

from fastdeploy.entrypoints.openai.errors import APIError

MAX_HEADER_BYTES = 32 * 1024   # names and values of all headers together
MAX_HEADERS = 100


class HeaderLimits:
    """A pure ASGI middleware (it sees each request before Starlette builds it)."""

    def __init__(self, app, max_bytes: int = MAX_HEADER_BYTES, max_count: int = MAX_HEADERS):
        self.app, self.max_bytes, self.max_count = app, max_bytes, max_count

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = scope["headers"]
            size = sum(len(name) + len(value) for name, value in headers)
            if len(headers) > self.max_count or size > self.max_bytes:
                error = APIError(431, f"request headers too large: {len(headers)} headers of {size} bytes (at "
                                      f"most {self.max_count} headers and {self.max_bytes} bytes)")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
