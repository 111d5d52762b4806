"""Turns every refusal of the API server into an OpenAI error object whose `param` is the client's own field path
(docs/serving.md, "Errors").

Paths are written as the client wrote the body: `max_tokens`, `messages[0].content`, `stop[1]`,
`disaggregate_info.request_id`. Engine refusals arrive as text written for the engine's own names (`request <id>:`
prefixes, `prompt_token_ids`); `engine_refusal` rewrites them into the client's terms.
"""
from __future__ import annotations

import re

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from fastdeploy.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
from fastdeploy.http.json_body import INT64_MAX, join_path

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 409: "conflict_error", 413: "request_too_large",
                429: "rate_limit_error", 431: "request_too_large", 499: "client_closed_request",
                500: "internal_error", 503: "service_unavailable"}
_EXPECTED = {"string_type": "a string", "list_type": "a list", "int_type": "an integer", "bool_type": "a boolean",
             "float_type": "a number", "dict_type": "an object", "model_type": "an object", "none_required": "null",
             "model_attributes_type": "an object", "literal_error": "one of the allowed values"}
_REQUEST_PREFIX = re.compile(r"^(?:request [^:]*: |[A-Za-z]+\.add_request: )")
_QUOTED_FIELD = re.compile(r"'(\w+)'")


class APIError(Exception):
    """Becomes an OpenAI error object with this HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        info = ErrorInfo(message=self.message, type=_ERROR_TYPES.get(self.status, "invalid_request_error"),
                         param=self.param, code=self.status)
        return ErrorResponse(error=info).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def validation_error(error: ValidationError, model: type[BaseModel]) -> APIError:
    """The failure of the first bad field, named by its client path. Where a field accepts several shapes the
    deepest failure is reported (the shape the client meant), or, when no shape got further than the value's type,
    the list of shapes the field accepts."""
    names = field_names(model)
    errors = error.errors(include_url=False)
    located = [(_client_loc(e["loc"], names, e["type"] == "extra_forbidden"), e) for e in errors]
    head = located[0][0][:1]
    same_field = [(loc, e) for loc, e in located if loc[:1] == head]
    loc, first = max(same_field, key=lambda item: len(item[0]))
    path = join_path(loc)
    if first["type"] == "extra_forbidden":
        return APIError(400, f"field '{path}' is not a known field of this endpoint", param=path)
    siblings = [e for l, e in same_field if l == loc]
    if len(siblings) > 1 and all(e["type"] in _EXPECTED for e in siblings):
        shapes = " or ".join(dict.fromkeys(_EXPECTED[e["type"]] for e in siblings))
        return APIError(400, f"field '{path}' must be {shapes}, got {_json_type(first['input'])}", param=path)
    return APIError(400, f"field '{path}': {_message(first)}" if path else _message(first), param=path)


def engine_refusal(text: str | None, prompt_field: str, id_in_use: bool = False) -> APIError:
    """An engine core's refusal of one request, in the client's terms: no `request <id>:` prefix, and the engine's
    `prompt_token_ids` named as the client's prompt field. `id_in_use` (the engine still holds state for the id:
    a live request, or a PD hand-off, reservation or quarantine of it) is a 409."""
    message = _REQUEST_PREFIX.sub("", text or "the engine refused the request")
    message = message.replace("'prompt_token_ids'", f"'{prompt_field}'").replace("prompt_token_ids", prompt_field)
    if id_in_use:
        return APIError(409, message.replace("'request_id'", "field 'disaggregate_info.request_id'"),
                        param="disaggregate_info.request_id")
    if message.startswith("disaggregate_info: "):
        match = _QUOTED_FIELD.search(message)
        return APIError(400, message, param="disaggregate_info" + (f".{match.group(1)}" if match else ""))
    match = _QUOTED_FIELD.search(message)
    if match is not None:
        return APIError(400, message, param=match.group(1))
    if "max_model_len" in message:
        return APIError(400, message, param="max_tokens")
    return APIError(400, message)


def field_error(error: ValueError) -> APIError:
    """A `SamplingParams` refusal (`SamplingParams: field 'x' ...`): the field is the client's field of that name."""
    text = str(error).removeprefix("SamplingParams: ")
    match = _QUOTED_FIELD.search(text)
    return APIError(400, text, param=match.group(1) if match else None)


def field_names(model: type[BaseModel]) -> set[str]:
    """Every field name of `model` and of the models nested in its fields (lists and unions included)."""
    names: set[str] = set()
    pending, seen = [model], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for name, info in current.model_fields.items():
            names.add(name)
            pending.extend(_models_in(info.annotation))
    return names


def _models_in(annotation) -> list[type[BaseModel]]:
    found, stack = [], [annotation]
    while stack:
        item = stack.pop()
        if isinstance(item, type) and issubclass(item, BaseModel):
            found.append(item)
        stack.extend(getattr(item, "__args__", ()))
    return found


def _client_loc(loc: tuple, names: set[str], unknown: bool) -> tuple:
    """Field names and list indices of a pydantic location; union-member tags (`str`, `list[int]`, ...) dropped.
    For an unknown field the last element is the client's own key and is kept."""
    kept = tuple(p for p in loc[:-1] if isinstance(p, int) or p in names)
    last = loc[-1] if loc else None
    if last is not None and (unknown or isinstance(last, int) or last in names):
        kept += (last,)
    return kept


def _message(error: dict) -> str:
    value = error.get("input")
    if error["type"] == "int_type" and isinstance(value, float) and abs(value) > INT64_MAX:
        # orjson turns an integer beyond 64 bits into a float
        return "integer out of range: integers must lie in [-2^63, 2^63 - 1] (docs/serving.md, \"Limits\")"
    if error["type"] in ("less_than_equal", "greater_than_equal") and isinstance(value, int) \
            and abs(value) > INT64_MAX:
        return f"integer out of range: {error['msg']}"
    return error["msg"].removeprefix("Value error, ")


def _json_type(value) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "a list",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)
