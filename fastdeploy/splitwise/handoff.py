"""The P→D hand-off message and its wire format (PD_MTP_FLOW §3, §4.4).

One `HandoffMessage` carries everything D needs to continue a request that P prefilled: the prompt, the sampling
values P used, t0, `draft_token_ids` (`[t0, d1]` with MTP), the KV of positions 0..L−1 for every target and MTP
layer, the configuration hash and the per-transfer integrity tag.

Wire format (version 1), little-endian, no pickling of arbitrary objects:

    b"FDPD" | u16 protocol version | u32 header length H | H bytes of UTF-8 JSON header | KV bytes

The header holds every scalar/list field and one `{"dtype", "shape"}` descriptor per KV array; the KV bytes are
the arrays' C-order contents concatenated in order (target layers, then MTP layers). The version sits in the fixed
prefix so an unknown version is reported before anything else is parsed.

Optional header field `t0_logprobs` (absent unless the request asked for logprobs, docs/design.md §6):
`{"logprob": float, "top_token_ids": [N ids], "top_logprobs": [N floats]}`, t0's log probability and the top-N
alternatives at its position on P. Like every header field it is in the canonical header and so in the integrity
tag; JSON floats (Python's shortest repr) round-trip exactly, so D reports P's values bit for bit.

Framed form (`encode_frames` / `decode` of a frame sequence): the same bytes cut at the array boundaries, frame 0
= prefix + header, then one frame per KV array, so a transport can send each array without copying it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from fastdeploy.schema.request import TokenLogprob
from fastdeploy.schema.sampling_params import MAX_LOGPROBS
from fastdeploy.splitwise.integrity import PROTOCOL_VERSION, canonical_json, integrity_tag

Buffer = Union[bytes, bytearray, memoryview]
# An encoded hand-off as transports carry it: the bytes of `encode()`, or the frames of `encode_frames()`.
Payload = Union[bytes, Sequence[Buffer]]
MAGIC = b"FDPD"
_PREFIX = struct.Struct("<4sHI")  # magic, protocol version, header length
# The KV dtypes the wire format can carry, by their canonical `dtype.str` ('<f4', '>f4', '|b1', ...): numeric
# kinds only (bfloat16 caches travel as their uint16 bit patterns).
_KV_DTYPES = {
    np.dtype(name).newbyteorder(order).str: np.dtype(name).newbyteorder(order)
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64")
    for order in "<>"
}


class HandoffDecodeError(ValueError):
    """The bytes are not a hand-off this build can read: bad magic, unknown version, truncated or malformed."""


def _require_int(owner: str, name: str, value: object, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{owner}: field '{name}' must be an int (got {type(value).__name__} {value!r})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}: field '{name}' must be >= {minimum} (got {value})")
    return int(value)


def _require_ids(owner: str, name: str, values: object) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise ValueError(f"{owner}: field '{name}' must be a sequence of token ids (got {type(values).__name__})")
    return tuple(_require_int(owner, f"{name}[{i}]", v, minimum=0) for i, v in enumerate(values))


def _require_float(owner: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not np.isfinite(value):
        raise ValueError(f"{owner}: field '{name}' must be a finite number (got {value!r})")
    return float(value)


@dataclass(frozen=True, slots=True)
class HandoffSamplingParams:
    """Exactly the sampling values P used for the request; D applies the same ones (PD_MTP_FLOW §3).

    `eos_token_ids` is the resolved set the request finishes on (the model's EOS ids plus the request's
    stop_token_ids); `stop_seqs` are the stop sequences as token-id lists. `max_tokens` and `min_tokens` count t0.
    """

    max_tokens: int
    min_tokens: int = 0
    stop_seqs: tuple[tuple[int, ...], ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        owner = "HandoffSamplingParams"
        set_ = object.__setattr__  # frozen dataclass: normalise in place once, here
        set_(self, "max_tokens", _require_int(owner, "max_tokens", self.max_tokens, minimum=1))
        set_(self, "min_tokens", _require_int(owner, "min_tokens", self.min_tokens, minimum=0))
        if isinstance(self.stop_seqs, (str, bytes)) or not isinstance(self.stop_seqs, Sequence):
            raise ValueError(f"{owner}: field 'stop_seqs' must be a sequence of token-id lists")
        stop_seqs = tuple(_require_ids(owner, f"stop_seqs[{i}]", s) for i, s in enumerate(self.stop_seqs))
        if any(len(s) == 0 for s in stop_seqs):
            raise ValueError(f"{owner}: field 'stop_seqs' must not contain an empty sequence")
        set_(self, "stop_seqs", stop_seqs)
        set_(self, "eos_token_ids", _require_ids(owner, "eos_token_ids", self.eos_token_ids))
        set_(self, "temperature", _require_float(owner, "temperature", self.temperature))
        set_(self, "top_p", _require_float(owner, "top_p", self.top_p))
        set_(self, "top_k", _require_int(owner, "top_k", self.top_k, minimum=0))
        if self.seed is not None:
            set_(self, "seed", _require_int(owner, "seed", self.seed))

    def to_json(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "min_tokens": self.min_tokens,
            "stop_seqs": [list(s) for s in self.stop_seqs],
            "eos_token_ids": list(self.eos_token_ids),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
        }

    @classmethod
    def from_json(cls, obj: object) -> HandoffSamplingParams:
        expected = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(obj, dict) or set(obj) != expected:
            got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise HandoffDecodeError(f"handoff decode: field 'sampling' must have keys {sorted(expected)} (got {got})")
        try:
            return cls(**obj)
        except ValueError as exc:
            raise HandoffDecodeError(f"handoff decode: {exc}") from exc


def _check_kv(owner: str, name: str, arrays: object, num_tokens: int) -> tuple[np.ndarray, ...]:
    if not isinstance(arrays, (list, tuple)):
        raise ValueError(f"{owner}: field '{name}' must be a list of numpy arrays, one per layer")
    for i, array in enumerate(arrays):
        where = f"{owner}: field '{name}[{i}]'"
        if not isinstance(array, np.ndarray):
            raise ValueError(f"{where} must be a numpy array (got {type(array).__name__})")
        if array.dtype.str not in _KV_DTYPES:
            raise ValueError(f"{where} must have a bool, int, uint or float dtype of at most 8 bytes "
                             f"(got {array.dtype})")
        if array.ndim < 1 or array.shape[0] != num_tokens:
            raise ValueError(f"{where} must have shape [L, ...] with L = {num_tokens} prompt tokens "
                             f"(got {list(array.shape)})")
    return tuple(arrays)


@dataclass(frozen=True, slots=True)
class HandoffMessage:
    """What P sends D for one request. Build it with `create()`, which computes the tag; `decode()` reads one.

    The KV payload may be empty only when t0 terminates the request (P MAY skip the transfer then, PD_MTP_FLOW §4.4).
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]  # [L]
    sampling: HandoffSamplingParams
    t0: int
    draft_token_ids: tuple[int, ...]  # [t0, d1] with MTP; [t0] or [] without speculation
    kv_target: tuple[np.ndarray, ...]  # one per target layer, [L, *layer_tail], positions 0..L-1
    kv_mtp: tuple[np.ndarray, ...]  # one per MTP layer, [L, *layer_tail], positions 0..L-1
    config_hash: str
    tag: str
    version: int = PROTOCOL_VERSION
    t0_logprobs: TokenLogprob | None = None  # t0's logprob and top-N on P; None unless the request asked

    def __post_init__(self) -> None:
        owner = "HandoffMessage"
        set_ = object.__setattr__
        if self.version != PROTOCOL_VERSION:
            raise ValueError(f"{owner}: field 'version' must be {PROTOCOL_VERSION} (got {self.version!r})")
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"{owner}: field 'request_id' must be a non-empty str (got {self.request_id!r})")
        set_(self, "prompt_token_ids", _require_ids(owner, "prompt_token_ids", self.prompt_token_ids))
        if not self.prompt_token_ids:
            raise ValueError(f"{owner}: field 'prompt_token_ids' must not be empty")
        if not isinstance(self.sampling, HandoffSamplingParams):
            raise ValueError(f"{owner}: field 'sampling' must be a HandoffSamplingParams")
        set_(self, "t0", _require_int(owner, "t0", self.t0, minimum=0))
        set_(self, "draft_token_ids", _require_ids(owner, "draft_token_ids", self.draft_token_ids))
        num_tokens = len(self.prompt_token_ids)
        set_(self, "kv_target", _check_kv(owner, "kv_target", self.kv_target, num_tokens))
        set_(self, "kv_mtp", _check_kv(owner, "kv_mtp", self.kv_mtp, num_tokens))
        for name in ("config_hash", "tag"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{owner}: field '{name}' must be a str")
        entry = self.t0_logprobs
        if entry is not None and (not isinstance(entry, TokenLogprob) or entry.token_id != self.t0
                                  or len(entry.top_token_ids) > MAX_LOGPROBS):
            raise ValueError(f"{owner}: field 't0_logprobs' must be None or a TokenLogprob of t0 ({self.t0}) with at "
                             f"most {MAX_LOGPROBS} alternatives (got {entry!r})")

    @classmethod
    def create(
        cls,
        *,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: HandoffSamplingParams,
        t0: int,
        draft_token_ids: Sequence[int],
        kv_target: Sequence[np.ndarray],
        kv_mtp: Sequence[np.ndarray],
        config_hash: str,
        t0_logprobs: TokenLogprob | None = None,
    ) -> HandoffMessage:
        """Build a message on P and seal it with its integrity tag."""
        unsealed = cls(request_id, tuple(prompt_token_ids), sampling, t0, tuple(draft_token_ids),
                       tuple(kv_target), tuple(kv_mtp), config_hash, tag="", t0_logprobs=t0_logprobs)
        return dataclasses.replace(unsealed, tag=unsealed.compute_tag())

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def has_kv(self) -> bool:
        return bool(self.kv_target or self.kv_mtp)

    def compute_tag(self) -> str:
        """The integrity tag this message's content should carry (PD_MTP_FLOW §3): compare with `tag` on receipt."""
        return integrity_tag(self._header(with_tag=False), self.kv_target + self.kv_mtp)

    def encode(self) -> bytes:
        return b"".join(self.encode_frames())

    def encode_frames(self) -> list[bytes | memoryview]:
        """The wire format cut into frames: prefix + header, then each KV array's bytes (views, not copies)."""
        header = canonical_json(self._header(with_tag=True))
        frames: list[bytes | memoryview] = [_PREFIX.pack(MAGIC, self.version, len(header)) + header]
        # reshape(-1) + view(uint8): a flat byte view of any C-contiguous array, empty ones included
        frames.extend(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data for a in self.kv_target + self.kv_mtp)
        return frames

    @classmethod
    def decode(cls, data: Payload) -> HandoffMessage:
        """Parse the bytes of `encode()`, or the frames of `encode_frames()` (a list or tuple of buffers). KV
        arrays are read-only views into the received buffers; nothing is executed."""
        if isinstance(data, (list, tuple)):
            if not data:
                raise HandoffDecodeError("handoff decode: no frames")
            view = memoryview(data[0]).cast("B")
            frames = [memoryview(f).cast("B") for f in data[1:]]
        else:
            view, frames = memoryview(data).cast("B"), None
        if len(view) < _PREFIX.size:
            raise HandoffDecodeError(
                f"handoff decode: truncated message: {len(view)} bytes, the fixed prefix alone is {_PREFIX.size}")
        magic, version, header_len = _PREFIX.unpack_from(view, 0)
        if magic != MAGIC:
            raise HandoffDecodeError(f"handoff decode: bad magic {bytes(magic)!r}, expected {MAGIC!r}")
        if version != PROTOCOL_VERSION:
            raise HandoffDecodeError(
                f"handoff decode: unknown protocol version {version}; this build reads version {PROTOCOL_VERSION}")
        body_start = _PREFIX.size + header_len
        if len(view) < body_start:
            raise HandoffDecodeError(
                f"handoff decode: truncated message: header needs {header_len} bytes, "
                f"{len(view) - _PREFIX.size} present")
        raw_header = bytes(view[_PREFIX.size:body_start])
        try:
            header = json.loads(raw_header.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HandoffDecodeError(f"handoff decode: header is not valid JSON: {exc}") from exc
        message = cls._from_header(header, view, body_start, frames)
        # Only the canonical spelling is accepted ('<f4' not '=f4', no spaces, '1e-05' not '1E-05'), so that any
        # change to the header bytes changes a decoded value and therefore the integrity tag.
        if canonical_json(message._header(with_tag=True)) != raw_header:
            raise HandoffDecodeError("handoff decode: header is not in canonical form")
        return message

    def _header(self, *, with_tag: bool) -> dict[str, Any]:
        header = {
            "request_id": self.request_id,
            "prompt_token_ids": list(self.prompt_token_ids),
            "sampling": self.sampling.to_json(),
            "t0": self.t0,
            "draft_token_ids": list(self.draft_token_ids),
            "config_hash": self.config_hash,
            "kv": {
                "target": [_describe(a) for a in self.kv_target],
                "mtp": [_describe(a) for a in self.kv_mtp],
            },
        }
        if self.t0_logprobs is not None:
            entry = self.t0_logprobs
            header["t0_logprobs"] = {"logprob": entry.logprob, "top_token_ids": list(entry.top_token_ids),
                                     "top_logprobs": list(entry.top_logprobs)}
        if with_tag:
            header["tag"] = self.tag
        return header

    @classmethod
    def _from_header(cls, header: object, view: memoryview, body_start: int,
                     frames: list[memoryview] | None) -> HandoffMessage:
        keys = {"request_id", "prompt_token_ids", "sampling", "t0", "draft_token_ids", "config_hash", "kv", "tag"}
        if not isinstance(header, dict) or not keys <= set(header) <= keys | {"t0_logprobs"}:
            got = sorted(header) if isinstance(header, dict) else type(header).__name__
            raise HandoffDecodeError(f"handoff decode: header must have keys {sorted(keys)} and optionally "
                                     f"'t0_logprobs' (got {got})")
        kv = header["kv"]
        if not isinstance(kv, dict) or set(kv) != {"target", "mtp"}:
            raise HandoffDecodeError("handoff decode: field 'kv' must have keys ['mtp', 'target']")
        for group in ("target", "mtp"):
            if not isinstance(kv[group], list):
                raise HandoffDecodeError(f"handoff decode: field 'kv.{group}' must be a list")
        descs = [(f"kv.{group}[{i}]", desc) for group in ("target", "mtp") for i, desc in enumerate(kv[group])]
        if frames is None:
            read, offset = [], body_start
            for name, desc in descs:
                array, offset = _read_array(view, offset, desc, name)
                read.append(array)
            if offset != len(view):
                raise HandoffDecodeError(
                    f"handoff decode: {len(view) - offset} unexpected trailing bytes after the KV payload")
        else:
            if body_start != len(view):
                raise HandoffDecodeError(
                    f"handoff decode: {len(view) - body_start} unexpected bytes after the header in frame 0")
            if len(frames) != len(descs):
                raise HandoffDecodeError(
                    f"handoff decode: {len(frames)} KV frames for {len(descs)} described arrays")
            read = []
            for (name, desc), frame in zip(descs, frames):
                array, end = _read_array(frame, 0, desc, name)
                if end != len(frame):
                    raise HandoffDecodeError(f"handoff decode: frame of '{name}' has {len(frame) - end} "
                                             "unexpected trailing bytes")
                read.append(array)
        arrays = {"target": read[:len(kv["target"])], "mtp": read[len(kv["target"]):]}
        try:
            return cls(
                request_id=header["request_id"],
                prompt_token_ids=header["prompt_token_ids"],
                sampling=HandoffSamplingParams.from_json(header["sampling"]),
                t0=header["t0"],
                draft_token_ids=header["draft_token_ids"],
                kv_target=tuple(arrays["target"]),
                kv_mtp=tuple(arrays["mtp"]),
                config_hash=header["config_hash"],
                tag=header["tag"],
                t0_logprobs=_read_t0_logprobs(header),
            )
        except HandoffDecodeError:
            raise
        except ValueError as exc:
            raise HandoffDecodeError(f"handoff decode: {exc}") from exc


def _read_t0_logprobs(header: dict) -> TokenLogprob | None:
    """The optional `t0_logprobs` header field as a TokenLogprob of t0 (ValueError naming the field)."""
    entry = header.get("t0_logprobs")
    if entry is None:
        return None
    if not isinstance(entry, dict) or set(entry) != {"logprob", "top_token_ids", "top_logprobs"}:
        raise ValueError("field 't0_logprobs' must have keys ['logprob', 'top_logprobs', 'top_token_ids']")
    ids, values = entry["top_token_ids"], entry["top_logprobs"]
    if not isinstance(ids, list) or not isinstance(values, list):
        raise ValueError("field 't0_logprobs': 'top_token_ids' and 'top_logprobs' must be lists")
    return TokenLogprob(header["t0"], entry["logprob"], tuple(ids), tuple(values))


def _describe(array: np.ndarray) -> dict[str, Any]:
    # dtype.str keeps the byte order ('<f4'), so a big-endian peer's bytes are never misread.
    return {"dtype": array.dtype.str, "shape": list(array.shape)}


def _read_array(view: memoryview, offset: int, desc: object, name: str) -> tuple[np.ndarray, int]:
    """Read one KV array described by `desc` at `offset`; returns it and the offset just past it."""
    if not isinstance(desc, dict) or set(desc) != {"dtype", "shape"}:
        raise HandoffDecodeError(f"handoff decode: field '{name}' must be {{'dtype', 'shape'}}")
    shape = desc["shape"]
    if not isinstance(shape, list) or not shape or \
            any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise HandoffDecodeError(f"handoff decode: field '{name}.shape' must be a non-empty list of ints >= 0")
    # A table lookup, never np.dtype(<received text>): numpy parses far more than dtype names.
    dtype = _KV_DTYPES.get(desc["dtype"]) if isinstance(desc["dtype"], str) else None
    if dtype is None:
        raise HandoffDecodeError(f"handoff decode: field '{name}.dtype' is not a numeric dtype: {desc['dtype']!r}")
    count = math.prod(shape)  # Python ints: a forged huge shape cannot overflow
    end = offset + count * dtype.itemsize
    if end > len(view):
        raise HandoffDecodeError(
            f"handoff decode: truncated message: '{name}' needs bytes [{offset}, {end}), only {len(view)} present")
    array = np.frombuffer(view, dtype=dtype, count=count, offset=offset).reshape(shape)
    array.flags.writeable = False  # also when the caller passed a bytearray: D must not write into P's bytes
    return array, end
