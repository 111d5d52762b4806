"""Defines the messages between an API server and its engine core process, and their encoding.

Every message is a typed `msgspec.Struct`; on the wire it is one ZeroMQ frame of MessagePack, tagged with the
message's type name (field `type`). msgspec encodes and decodes the structs directly — no intermediate dicts per
request, which is most of the API server's cost per token otherwise — and validates types on decode, with no
pickle: a frame from a confused peer can fail to decode, never run code. `decode_message` raises ValueError naming
the problem.
"""
from __future__ import annotations

from typing import Union

import msgspec


from fastdeploy.schema.request import TokenLogprob


class _Message(msgspec.Struct, tag_field="type", tag=True, forbid_unknown_fields=True):
    """Base of the messages that travel as frames (tagged with their class name)."""


# ---- API server -> engine core ----


class AddRequest(_Message):
    """One request to queue. `params` are SamplingParams fields; `stop_seqs` the stop strings as token ids.
    `disaggregate_info` is the opaque PD field of the HTTP body, passed to the instance only when present."""

    request_id: str
    prompt_token_ids: list[int]
    params: dict
    stop_seqs: list[list[int]] = []
    prompt: str | None = None
    disaggregate_info: dict | None = None


class AbortRequest(_Message):
    request_id: str
    error: str | None = None


class Shutdown(_Message):
    """Finish nothing more: abort what is live, report it, and exit 0."""


class ResetPrefixCache(_Message):
    """Drop every cached KV block no request references (POST /reset_prefix_cache); answered in the next
    StepOutputs' `prefix_cache_resets` under `reset_id`."""

    reset_id: int


# ---- engine core -> API server ----


class PrefixCacheStats(msgspec.Struct, forbid_unknown_fields=True):
    """The instance's prefix-cache lookups since it started (cumulative; at each request's first admission)."""

    requests: int
    hit_requests: int        # requests of which at least one block hit
    query_tokens: int        # prompt tokens looked up
    hit_tokens: int          # ... whose KV came from the cache
    cached_blocks: int       # blocks the cache names now


class EngineStats(msgspec.Struct, forbid_unknown_fields=True):
    """The instance's load after a step (sent at least every heartbeat interval while the core is idle)."""

    num_running: int
    num_waiting: int
    free_slots: int
    total_slots: int
    free_kv_blocks: int
    total_kv_blocks: int
    # PD instances only (SERVICES §4): cumulative hand-off counters, refusals by reason, held blocks, and the
    # hand-off latencies observed since the previous report (see the connectors' `counters`).
    pd: dict | None = None
    prefix_cache: PrefixCacheStats | None = None   # None with prefix caching off


class RequestDelta(msgspec.Struct, forbid_unknown_fields=True):
    """What one step added to one request. `finished` deltas carry the final figures: `finish_reason` is
    "stop", "length" or "abort" (then `error` says why; `rejected` when add_request refused it, `id_in_use` when
    because the instance still holds state for its id, `pair_mismatch` when D refused P's hand-off as made for
    another request than D's), and the request's
    phases as the engine core saw them (seconds; None for a phase it never reached): queue = arrival at the core
    to its first admission to a slot, prefill = admission to the first output token, decode = first token to the
    finish, inference = admission to the finish. `new_logprobs` has one entry per new token when the request asked
    for logprobs, else None (MessagePack carries the float64 values exactly)."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprob] | None = None
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    rejected: bool = False
    id_in_use: bool = False
    pair_mismatch: bool = False     # an abort: D refused P's hand-off as made for another request (HTTP 409)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0      # of the prompt tokens, those whose KV came from the prefix cache
    num_output_tokens: int = 0
    num_decode_rounds: int = 0
    num_draft_tokens: int = 0
    num_accepted_drafts: int = 0
    queue_time_s: float | None = None
    prefill_time_s: float | None = None
    decode_time_s: float | None = None
    inference_time_s: float | None = None

    def __post_init__(self):
        entries = self.new_logprobs
        if entries is not None and [e.token_id for e in entries] != self.new_token_ids:
            raise ValueError("RequestDelta: field 'new_logprobs' must name exactly the tokens of 'new_token_ids'")


class StepOutputs(_Message):
    """One message per processed step (and every heartbeat interval while idle, to refresh the load): the deltas
    of every request that changed."""

    deltas: list[RequestDelta]
    stats: EngineStats
    prefix_cache_resets: dict[int, int] = {}   # reset_id -> blocks dropped, for each ResetPrefixCache handled
    # host seconds of each computing step since the previous message (StepTimes.host plus the core's building of
    # this message's deltas): the histogram fastdeploy:step_host_seconds
    step_host_seconds: list[float] = []


class Heartbeat(_Message):
    """Sent by the engine core's own thread every heartbeat interval, whatever its step loop does (engine/pulse.py):
    `turns` step-loop turns finished so far, `busy_s` how long the turn now running has run (0 between turns)."""

    turns: int
    busy_s: float


class Ready(_Message):
    """Sent once the instance is built. `info` describes it (model, K, limits) for /v1/models and checks."""

    info: dict


class CoreFailed(_Message):
    """The engine core is about to exit abnormally (instance build or step raised); `error` says why."""

    error: str


Message = Union[AddRequest, AbortRequest, Shutdown, ResetPrefixCache, StepOutputs, Heartbeat, Ready, CoreFailed]
_MESSAGE_TYPES = Message.__args__

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode_message(message: Message) -> bytes:
    if not isinstance(message, _MESSAGE_TYPES):
        raise ValueError(f"encode_message: argument 'message' has unknown type {type(message).__name__}")
    return _encoder.encode(message)


def decode_message(frame: bytes) -> Message:
    try:
        return _decoder.decode(frame)
    except msgspec.DecodeError as error:   # ValidationError included: wrong type, unknown tag, missing field
        raise ValueError(f"decode_message: {error}") from None


class _StepOutputsParts(msgspec.Struct, tag_field="type", tag="StepOutputs"):
    deltas: list[msgspec.Raw]
    stats: EngineStats
    prefix_cache_resets: dict[int, int] = {}


class _DeltaId(msgspec.Struct):
    request_id: str


def salvage_step_outputs(frame: bytes) -> tuple[StepOutputs, list[tuple[str | None, str]]] | None:
    """A StepOutputs frame that `decode_message` refused, delta by delta: the valid deltas, and (request id or
    None, why) for each invalid one, so one bad delta costs only its own request. None when the frame is not a
    StepOutputs with readable stats."""
    try:
        parts = msgspec.msgpack.decode(frame, type=_StepOutputsParts)
    except msgspec.DecodeError:
        return None
    deltas, dropped = [], []
    for raw in parts.deltas:
        try:
            deltas.append(msgspec.msgpack.decode(raw, type=RequestDelta))
        except msgspec.DecodeError as error:
            try:
                request_id = msgspec.msgpack.decode(raw, type=_DeltaId).request_id
            except msgspec.DecodeError:
                request_id = None
            dropped.append((request_id, str(error)))
    return StepOutputs(deltas=deltas, stats=parts.stats, prefix_cache_resets=parts.prefix_cache_resets), dropped
