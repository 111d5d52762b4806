"""D's receipt checks on a hand-off, as a pure function returning a typed verdict (PD_MTP_FLOW §5.2).

The checks run in the spec's order and the first that decides wins:

1. the KV starts where D's reservation said (D's prefix cache holds the positions before, PD_MTP_FLOW §13.6),
   integrity tag (over the inline KV, or over D's own blocks for a placed hand-off; with the keys of the blocks D
   reused), configuration hash (and, when D gives it, the KV layout) → `Reject` "corrupted/mismatched"
1b. the hand-off is for D's own request (when D gives its `RequestExpectation`): the same prompt ids and the same
   sampling values (the seed only when D's request set one) → `Reject` MISMATCH naming the first field that differs
2. t0 terminates the request (an EOS id, or max_tokens ≤ 1)           → `FinishAtReceipt` with [t0]
3. draft ids: with MTP ≥ 2 of them starting with t0; without, [t0] or none → `Reject`
4. the KV payload is there (the in-process transport delivers KV and result together) → `Insert`

A verdict never touches engine state: the engine frees D's preallocated blocks for `FinishAtReceipt` and
`Reject`, and inserts the task (PD_MTP_FLOW §5.3) for `Insert`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from fastdeploy.precision import kv_storage_dtype
from fastdeploy.schema.request import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, TokenLogprob
from fastdeploy.splitwise.handoff import (Buffer, HandoffDecodeError, HandoffMessage, HandoffSamplingParams, KVSpec,
                                         Payload, kv_start_error)
from fastdeploy.splitwise.integrity import UNKEYED, HandoffKey, tags_equal

# D's own blocks of a request as the tag reads them: given n, the bytes of n positions of every layer in layer
# order (worker/kv_transfer.py `PromptKVPort.prompt_kv_chunks`, bound to the blocks the hand-off's KV went into:
# positions kv_start..L−1, n = L − kv_start).
InPlaceKV = Callable[[int], Iterable[Buffer]]


class ReceiptCheck(enum.IntEnum):
    """The PD_MTP_FLOW §5.2 step that produced a verdict."""

    INTEGRITY = 1
    TERMINATES = 2
    DRAFT_IDS = 3
    KV_READY = 4
    MISMATCH = 5   # step 1b: the hand-off was made for another request than D's (docs/design.md §8)


@dataclass(frozen=True, slots=True)
class RequestExpectation:
    """D's own request, which a hand-off must match: its prompt ids and its sampling values (`sampling.seed` None
    when D's request set no seed: then D continues with P's); and what D's reservation said: the prompt positions
    its prefix cache holds (`kv_start`, a whole number of blocks) and those blocks' keys (`reused`, under the
    tag)."""

    prompt_token_ids: tuple[int, ...]
    sampling: HandoffSamplingParams
    kv_start: int = 0
    reused: bytes = b""


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The KV layers D's cache holds, to check a payload against before it is scattered into D's blocks."""

    target_tails: tuple[tuple[int, ...], ...]  # trailing dims of each target layer (after [num_blocks, block_size])
    mtp_tails: tuple[tuple[int, ...], ...]  # same for the MTP module's layers
    dtype: str  # the cache's KV dtype, "float32", "float64" or "bfloat16" (held as uint16: precision.kv_storage_dtype)


@dataclass(frozen=True, slots=True)
class Insert:
    """Step 4: insert the request into a free slot at the next step (PD_MTP_FLOW §5.3)."""

    message: HandoffMessage
    check: ReceiptCheck = ReceiptCheck.KV_READY

    @property
    def request_id(self) -> str:
        return self.message.request_id


@dataclass(frozen=True, slots=True)
class FinishAtReceipt:
    """Step 2: t0 ends the request. Output is [t0]; no slot is used; D frees its preallocated blocks."""

    request_id: str
    token_ids: tuple[int, ...]  # [1]: (t0,)
    finish_reason: str  # "stop" (t0 is an EOS id) or "length" (max_tokens <= 1)
    check: ReceiptCheck = ReceiptCheck.TERMINATES
    t0_logprobs: TokenLogprob | None = None  # the message's, when the request asked for logprobs


@dataclass(frozen=True, slots=True)
class Reject:
    """Steps 1, 3 or 4 failed: fail the request with `error`; no slot is used; D frees its blocks."""

    request_id: str
    check: ReceiptCheck
    error: str
    finish_reason: str = FINISH_ABORT


ReceiptVerdict = Insert | FinishAtReceipt | Reject


def check_receipt(
    message: HandoffMessage,
    *,
    config_hash: str,
    num_speculative_tokens: int,
    kv_layout: KVLayout | None = None,
    key: HandoffKey | None = None,
    kv_in_place: InPlaceKV | None = None,
    expect: RequestExpectation | None = None,
    kv_landed: int | None = None,
) -> ReceiptVerdict:
    """Run the PD_MTP_FLOW §5.2 checks on a decoded message; `config_hash`, K, `kv_layout` and `key` (the hand-off
    key of D's PD secret, None without one) are D's own configuration, `expect` D's own request. A placed hand-off
    is verified over D's own blocks, which `kv_in_place` reads in place; a streamed one (`kv_landed`: the KV bytes
    the transport wrote into D's blocks, comparing this message's tag over them as they arrived, kv_stream.py) is
    not hashed again."""
    rid = message.request_id
    mismatch = _integrity_error(message, config_hash, kv_layout, key or UNKEYED, kv_in_place, kv_landed, expect)
    if mismatch is not None:
        return Reject(rid, ReceiptCheck.INTEGRITY, f"PD: request {rid}: corrupted/mismatched hand-over: {mismatch}")
    other = None if expect is None else request_mismatch(message, expect)
    if other is not None:
        return Reject(rid, ReceiptCheck.MISMATCH, f"PD: request {rid}: the hand-off from P was made for another "
                                                  f"request than D's: {other} (P and D were given different "
                                                  "bodies under one request id)")

    if kv_landed is not None and kv_landed != message.kv_nbytes:   # after 1b: another prompt lands nothing
        return Reject(rid, ReceiptCheck.INTEGRITY, f"PD: request {rid}: corrupted/mismatched hand-over: "
                                                   f"{kv_landed} KV bytes landed in D's blocks, the hand-off "
                                                   f"describes {message.kv_nbytes}")
    sampling = message.sampling
    if message.t0 in sampling.eos_token_ids:
        return FinishAtReceipt(rid, (message.t0,), FINISH_STOP, t0_logprobs=message.t0_logprobs)
    if sampling.max_tokens <= 1:
        return FinishAtReceipt(rid, (message.t0,), FINISH_LENGTH, t0_logprobs=message.t0_logprobs)

    draft_error = _draft_ids_error(message, num_speculative_tokens)
    if draft_error is not None:
        return Reject(rid, ReceiptCheck.DRAFT_IDS, draft_error)

    if not message.has_kv:
        return Reject(rid, ReceiptCheck.KV_READY,
                      f"PD: request {rid} arrived from P without a KV payload although t0 does not finish it")
    return Insert(message)


def receive_handoff(
    request_id: str,
    payload: Payload,
    *,
    config_hash: str,
    num_speculative_tokens: int,
    kv_layout: KVLayout | None = None,
    key: HandoffKey | None = None,
    kv_in_place: InPlaceKV | None = None,
    expect: RequestExpectation | None = None,
    kv_landed: int | None = None,
) -> ReceiptVerdict:
    """Decode a hand-off delivered for `request_id` (the transport's envelope) and check it (`check_receipt`).

    Bytes that do not decode, or that decode to another request, are step-1 failures for `request_id`, so the
    right request fails at once instead of waiting for its deadline.
    """
    try:
        message = HandoffMessage.decode(payload)
    except HandoffDecodeError as exc:
        return Reject(request_id, ReceiptCheck.INTEGRITY,
                      f"PD: request {request_id}: corrupted/mismatched hand-over: {exc}")
    if message.request_id != request_id:
        return Reject(request_id, ReceiptCheck.INTEGRITY,
                      f"PD: request {request_id}: corrupted/mismatched hand-over: "
                      f"the message inside is for request {message.request_id}")
    return check_receipt(message, config_hash=config_hash, num_speculative_tokens=num_speculative_tokens,
                         kv_layout=kv_layout, key=key, kv_in_place=kv_in_place, expect=expect, kv_landed=kv_landed)


def request_mismatch(message: HandoffMessage, expect: RequestExpectation) -> str | None:
    """What differs between the hand-off and D's own request (the first difference), None when nothing does."""
    theirs, ours = message.prompt_token_ids, expect.prompt_token_ids
    if theirs != ours:
        if len(theirs) != len(ours):
            return f"its prompt has {len(theirs)} tokens, D's request has {len(ours)}"
        at = next(i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b)
        return f"its prompt differs from D's at token {at} (P: {theirs[at]}, D: {ours[at]})"
    p, d = message.sampling, expect.sampling
    as_sets = {"stop_seqs": set, "eos_token_ids": set}
    for name in ("max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                 "frequency_penalty", "presence_penalty", "logprobs", "stop_seqs", "eos_token_ids", "seed"):
        if name == "seed" and d.seed is None:
            continue
        normal = as_sets.get(name, lambda value: value)
        if normal(getattr(p, name)) != normal(getattr(d, name)):
            return f"'{name}' differs (P: {_short(getattr(p, name))}, D: {_short(getattr(d, name))})"
    return None


def _short(value: object) -> str:
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= 80 else text[:77] + "..."


def _integrity_error(message: HandoffMessage, config_hash: str, kv_layout: KVLayout | None, key: HandoffKey,
                     kv_in_place: InPlaceKV | None, kv_landed: int | None,
                     expect: RequestExpectation | None) -> str | None:
    kv_start, reused = (0, b"") if expect is None else (expect.kv_start, expect.reused)
    if message.kv_start != kv_start:
        return kv_start_error(message.kv_start, kv_start)
    if message.keyed != key.is_keyed:
        return ("P sealed the hand-off with a PD secret and D has none" if message.keyed else
                "P sealed the hand-off without a PD secret and D has one") + \
            " (FD_PD_SECRET / --pd-secret-file must be the same on both)"
    layout_error = _layout_error(message, kv_layout) if kv_layout is not None and message.has_kv else None
    if kv_landed is not None:
        if message.kv_inline:
            return "a streamed hand-off's header must describe its KV as placed (kv.inline false)"
        expected_tag = message.tag   # compared by the transport over the bytes as they landed
    elif message.kv_inline:
        expected_tag = message.compute_tag(key, reused=reused)
    elif kv_in_place is None:
        return "P placed the KV in D's blocks out of band, but D expects it inline (the transports differ)"
    elif layout_error is not None:
        return layout_error  # D's blocks cannot be read in the shapes P described
    else:
        try:
            expected_tag = message.compute_tag(key, kv_in_place(message.num_prompt_tokens - kv_start), reused)
        except ValueError as exc:
            return f"D's blocks cannot be verified: {exc}"
    if not tags_equal(message.tag, expected_tag):
        return f"integrity tag {message.tag!r} does not match the content's {expected_tag!r}"
    if message.config_hash != config_hash:
        return (f"configuration hash {message.config_hash!r} from P differs from D's {config_hash!r} "
                "(K, MTP model, block size, KV dtype, vocabulary, transport or protocol version differ)")
    return layout_error


def _layout_error(message: HandoffMessage, kv_layout: KVLayout) -> str | None:
    target, mtp = message.kv_specs()
    return (_group_layout_error("kv_target", target, kv_layout.target_tails, kv_layout.dtype)
            or _group_layout_error("kv_mtp", mtp, kv_layout.mtp_tails, kv_layout.dtype))


def _group_layout_error(name: str, specs: Sequence[KVSpec], tails: Sequence[tuple[int, ...]],
                        dtype: str) -> str | None:
    if len(specs) != len(tails):
        return f"'{name}' has {len(specs)} layers, D's cache has {len(tails)}"
    held = kv_storage_dtype(dtype)
    for i, (spec, tail) in enumerate(zip(specs, tails)):
        if spec.shape[1:] != tuple(tail) or spec.dtype != held.str:
            as_held = "" if held.name == dtype else f" (held as {held.name})"
            return (f"'{name}[{i}]' is {np.dtype(spec.dtype)}{list(spec.shape[1:])} per token, "
                    f"D's cache layer is {dtype}{as_held}{list(tail)}")
    return None


def _draft_ids_error(message: HandoffMessage, num_speculative_tokens: int) -> str | None:
    rid, drafts, t0 = message.request_id, message.draft_token_ids, message.t0
    if num_speculative_tokens >= 1:
        if len(drafts) < 2:
            noun = "draft id" if len(drafts) == 1 else "draft ids"
            return (f"PD+MTP: request {rid} arrived from P with {len(drafts)} {noun}; "
                    "2 are required (first token + one MTP draft)")
        if drafts[0] != t0:
            return (f"PD+MTP: request {rid} arrived from P with draft_token_ids[0] = {drafts[0]}, "
                    f"but the first token is {t0}; the list must start with it")
        return None
    if drafts not in ((), (t0,)):
        return (f"PD: request {rid} arrived from P with draft ids {list(drafts)}; without speculation only "
                f"[{t0}] (the first token) or none are allowed")
    return None
