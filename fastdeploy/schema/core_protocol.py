"""Defines the messages between an API server and its engine core process, and their JSON encoding.

Every message is a slotted dataclass; on the wire it is one ZeroMQ frame of UTF-8 JSON `{"type": name, ...fields}`
(no pickle: a frame from a confused peer can fail to decode, never run code). `decode_message` raises ValueError
naming the problem.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from fastdeploy.schema.request import TokenLogprob

# ---- API server -> engine core ----


@dataclass(slots=True)
class AddRequest:
    """One request to queue. `params` are SamplingParams fields; `stop_seqs` the stop strings as token ids.
    `disaggregate_info` is the opaque PD field of the HTTP body, passed to the instance only when present."""

    request_id: str
    prompt_token_ids: list[int]
    params: dict
    stop_seqs: list[list[int]] = field(default_factory=list)
    prompt: str | None = None
    disaggregate_info: dict | None = None


@dataclass(slots=True)
class AbortRequest:
    request_id: str
    error: str | None = None


@dataclass(slots=True)
class Shutdown:
    """Finish nothing more: abort what is live, report it, and exit 0."""


# ---- engine core -> API server ----


@dataclass(slots=True)
class EngineStats:
    """The instance's load after a step (also the heartbeat: sent at least every heartbeat interval)."""

    num_running: int
    num_waiting: int
    free_slots: int
    total_slots: int
    free_kv_blocks: int
    total_kv_blocks: int
    # PD instances only (SERVICES §4): cumulative hand-off counters, refusals by reason, held blocks, and the
    # hand-off latencies observed since the previous report (see the connectors' `counters`).
    pd: dict | None = None


@dataclass(slots=True)
class RequestDelta:
    """What one step added to one request. `finished` deltas carry the final figures: `finish_reason` is
    "stop", "length" or "abort" (then `error` says why; `rejected` when add_request refused it). `new_logprobs`
    has one entry per new token when the request asked for logprobs, else None; on the wire each entry is
    `[token_id, logprob, [top ids], [top logprobs]]` (JSON floats round-trip exactly)."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprob] | None = None
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    rejected: bool = False
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_decode_rounds: int = 0
    num_draft_tokens: int = 0
    num_accepted_drafts: int = 0


@dataclass(slots=True)
class StepOutputs:
    """One message per processed step (or per heartbeat): the deltas of every request that changed."""

    deltas: list[RequestDelta]
    stats: EngineStats


@dataclass(slots=True)
class Ready:
    """Sent once the instance is built. `info` describes it (model, K, limits) for /v1/models and checks."""

    info: dict


@dataclass(slots=True)
class CoreFailed:
    """The engine core is about to exit abnormally (instance build or step raised); `error` says why."""

    error: str


_TYPES = {cls.__name__: cls for cls in (AddRequest, AbortRequest, Shutdown, Ready, StepOutputs, CoreFailed)}


_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls in (*_TYPES.values(), RequestDelta, EngineStats)}


def _fields(obj) -> dict:
    """Shallow field dict (dataclasses.asdict deep-copies every token list: ~1 ms for a 32-request step)."""
    return {name: getattr(obj, name) for name in _FIELDS[type(obj)]}


def _delta_fields(delta: RequestDelta) -> dict:
    body = _fields(delta)
    if delta.new_logprobs is not None:
        body["new_logprobs"] = [[e.token_id, e.logprob, e.top_token_ids, e.top_logprobs] for e in delta.new_logprobs]
    return body


def _decode_delta(data: dict) -> RequestDelta:
    delta = RequestDelta(**data)
    entries = delta.new_logprobs
    if entries is None:
        return delta
    if not isinstance(entries, list) or len(entries) != len(delta.new_token_ids):
        raise ValueError(f"decode_message: RequestDelta field 'new_logprobs' must be a list with one entry per new "
                         f"token ({len(delta.new_token_ids)})")
    try:
        delta.new_logprobs = [TokenLogprob(token, logprob, tuple(ids), tuple(values))
                              for token, logprob, ids, values in entries]
    except (TypeError, ValueError) as error:
        raise ValueError(f"decode_message: RequestDelta field 'new_logprobs': {error}") from None
    if [e.token_id for e in delta.new_logprobs] != delta.new_token_ids:
        raise ValueError("decode_message: RequestDelta field 'new_logprobs' names other tokens than "
                         "'new_token_ids'")
    return delta


def encode_message(message) -> bytes:
    name = type(message).__name__
    if name not in _TYPES:
        raise ValueError(f"encode_message: argument 'message' has unknown type {name}")
    if isinstance(message, StepOutputs):
        body = {"deltas": [_delta_fields(d) for d in message.deltas], "stats": _fields(message.stats)}
    else:
        body = _fields(message)
    return json.dumps({"type": name, **body}, separators=(",", ":")).encode()


def decode_message(frame: bytes):
    try:
        data = json.loads(frame)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"decode_message: frame is not JSON ({error})") from None
    if not isinstance(data, dict) or data.get("type") not in _TYPES:
        raise ValueError(f"decode_message: frame has no known 'type' (got {str(data)[:80]!r})")
    cls = _TYPES[data.pop("type")]
    names = {f.name for f in fields(cls)}
    if set(data) - names:
        raise ValueError(f"decode_message: {cls.__name__} has unknown field(s) {sorted(set(data) - names)}")
    try:
        if cls is StepOutputs:
            return StepOutputs(deltas=[_decode_delta(d) for d in data["deltas"]], stats=EngineStats(**data["stats"]))
        return cls(**data)
    except (TypeError, KeyError) as error:
        raise ValueError(f"decode_message: malformed {cls.__name__} ({error})") from None
