"""Parses a request body into a JSON object under the documented input limits (docs/serving.md, "Limits"), for
the API server and the router alike (neither imports the other for it).

orjson parses the body: it refuses nesting deeper than 1024 levels, numbers that overflow a double, lone UTF-16
surrogates and invalid UTF-8, all without recursion in Python. Where orjson's refusal is about one value (a huge
number, a lone surrogate), the body is parsed once more by the standard library with hooks that mark such values
instead of converting them, and the first marked value is named by its path, so the client learns which field
is at fault (`max_tokens`, `messages[0].content`).
"""
from __future__ import annotations

import json
import math
import re

import orjson
from starlette.requests import ClientDisconnect, Request

INT64_MAX = 2 ** 63 - 1

MAX_JSON_DEPTH = 1024          # orjson's own limit: arrays and objects nested deeper are refused
MAX_INT_DIGITS = 19            # any integer of more digits is outside int64
_SURROGATE = re.compile("[\ud800-\udfff]")
_VALUE_ERRORS = ("number is infinity", "surrogate", "number out of range")


class BodyError(ValueError):
    """The body cannot be served: `status` (400), the message, and the client field at fault (or None)."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def join_path(parts) -> str | None:
    """`("messages", 0, "content")` -> `messages[0].content`."""
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


class _OutOfRange:
    """Stands for a number the API cannot hold (an integer beyond int64, a float beyond a double)."""

    def __init__(self, text: str):
        self.text = text


async def read_body(request: Request, max_bytes: int, limit: str) -> bytes:
    """The whole body; 413 past `max_bytes` (declared or counted; `limit` names the setting), 499 when the client
    leaves before its end."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyError(413, f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes ({limit})")
    body = bytearray()
    try:
        async for part in request.stream():
            body += part
            if len(body) > max_bytes:
                raise BodyError(413, f"request body exceeds the limit of {max_bytes} bytes ({limit})")
    except ClientDisconnect:
        raise BodyError(499, "the client disconnected before the request body was complete") from None
    return bytes(body)


def parse_object(body: bytes) -> dict:
    """The body as a JSON object; BodyError 400 naming the reason, and the field when one value is at fault."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        reason = str(error)
        if any(kind in reason for kind in _VALUE_ERRORS):
            raise _bad_value(body, reason) from None
        if "depth limit" in reason:
            raise BodyError(400, f"request body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels") \
                from None
        raise BodyError(400, f"request body is not valid JSON: {reason}") from None
    if not isinstance(data, dict):
        raise BodyError(400, "request body must be a JSON object")
    return data


def _bad_value(body: bytes, reason: str) -> BodyError:
    """Re-parse with the standard library (values marked, not converted) and name the first bad value."""
    try:
        data = json.loads(body.decode("utf-8"), parse_int=_int, parse_float=_float,
                          parse_constant=lambda name: _OutOfRange(name))
    except (ValueError, RecursionError):
        return BodyError(400, f"request body is not valid JSON: {reason}")
    found = _first_bad(data)
    if found is None:
        return BodyError(400, f"request body is not valid JSON: {reason}")
    path, what = found
    where = f"field '{path}'" if path else "the request body"
    if what == "number":
        return BodyError(400, f"{where}: number out of range: integers must lie in [-2^63, 2^63 - 1] and numbers "
                             "must be finite doubles (docs/serving.md, \"Limits\")", param=path)
    if what == "key":
        return BodyError(400, f"{where} has a key with a lone UTF-16 surrogate (\\ud800-\\udfff): strings must be "
                             "valid Unicode", param=path)
    return BodyError(400, f"{where} contains a lone UTF-16 surrogate (\\ud800-\\udfff): strings must be valid "
                         "Unicode", param=path)


def _int(text: str):
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        return _OutOfRange(text)
    value = int(text)
    return value if -INT64_MAX - 1 <= value <= INT64_MAX else _OutOfRange(text)


def _float(text: str):
    value = float(text)
    return value if math.isfinite(value) else _OutOfRange(text)


def _first_bad(data) -> tuple[str | None, str] | None:
    """(path, "number" | "string" | "key") of the first marked number or surrogate-bearing string, depth first,
    without recursion."""
    stack = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _OutOfRange):
            return join_path(path), "number"
        if isinstance(value, str) and _SURROGATE.search(value):
            return join_path(path), "string"
        if isinstance(value, dict):
            if any(_SURROGATE.search(key) for key in value):
                return join_path(path), "key"
            stack.extend((path + (key,), item) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((path + (i,), item) for i, item in reversed(list(enumerate(value))))
    return None
