"""The P→D hand-off message (PD_MTP_FLOW §3, §4.4), sealed with its wire format v2 tag.

One `HandoffMessage` carries everything D needs to continue a request that P prefilled: the prompt, the sampling
values P used, t0, `draft_token_ids` (`[t0, d1]` with MTP), the KV of positions 0..L−1 (or kv_start..L−1, below)
for every target and MTP layer, the configuration hash and the tag (integrity.py: one BLAKE3 pass over the canonical
header, then every KV byte in order; keyed when the deployment has a PD secret).

Wire format v2 (wire.py): `b"FDPD" | u16 version | u32 header length | canonical JSON header | KV bytes`. The header
holds every scalar/list field, `keyed`, and `kv = {"inline", "target", "mtp"}` with one `{"dtype", "shape"}`
descriptor per KV array; inline KV bytes are the arrays' C-order contents in order (target layers, then MTP layers).
A *placed* hand-off (`inline` false: the KV was written straight into D's blocks, e.g. by the Mooncake transfer
engine) carries the same descriptors and no KV bytes; D computes the tag over its own blocks.

Optional header field `t0_logprobs` (absent unless the request asked for logprobs, docs/design.md §6):
`{"logprob": float, "top_token_ids": [N ids], "top_logprobs": [N floats]}`, t0's log probability and the top-N
alternatives at its position on P. Like every header field it is in the canonical header and so under the tag;
JSON floats (Python's shortest repr) round-trip exactly, so D reports P's values bit for bit.

Optional header field `kv_start` (absent when 0, PD_MTP_FLOW §13.6): D's prefix cache already holds positions
0..kv_start−1 (a whole number of blocks, which D's reservation named), so the KV arrays cover positions
kv_start..L−1 only; the tag then also covers the prefix-cache keys of those reused blocks (integrity.py), which P
and D each compute from the prompt and which do not travel.

Framed form (`encode_frames` / `decode` of a frame sequence): frame 0 = prefix + header, then the KV bytes as
views (not copies) cut at array boundaries: one frame per buffer of consecutive arrays (one frame for P's gathered
hand-off, whose layers share one buffer), so a transport sends them without copying.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from fastdeploy.schema.request import TokenLogprob
from fastdeploy.schema.sampling_params import MAX_LOGPROBS
from fastdeploy.splitwise.handoff_sampling import HandoffSamplingParams, require_ids, require_int
from fastdeploy.splitwise.integrity import PROTOCOL_VERSION, UNKEYED, HandoffKey, canonical_json, coalesce
from fastdeploy.splitwise.wire import (
    KV_DTYPES,
    MAGIC,
    PREFIX,
    Buffer,
    HandoffDecodeError,
    KVSpec,
    parse_spec,
    read_array,
    read_prefix,
)

# An encoded hand-off as transports carry it: the bytes of `encode()`, or the frames of `encode_frames()`.
Payload = Union[bytes, Sequence[Buffer]]

__all__ = ["MAGIC", "Buffer", "HandoffDecodeError", "HandoffMessage", "HandoffSamplingParams", "KVSpec", "Payload",
           "PlacedKV"]


def kv_start_error(sent: int, reserved: int) -> str:
    """Why a hand-off whose KV starts at position `sent` is not the one D reserved (from `reserved`)."""
    if reserved:
        return (f"P sent the KV from position {sent}, D's reservation said its prefix cache holds positions "
                f"0..{reserved - 1}")
    return f"P sent the KV from position {sent}, D's reservation asked for all of it"


@dataclass(frozen=True, slots=True)
class PlacedKV:
    """The KV arrays of a placed hand-off: their descriptors only, the bytes already sit in D's blocks."""

    target: tuple[KVSpec, ...]
    mtp: tuple[KVSpec, ...]


def _check_kv(owner: str, name: str, arrays: object, num_tokens: int) -> tuple[KVSpec, ...]:
    """The arrays' descriptors, each checked."""
    if not isinstance(arrays, (list, tuple)):
        raise ValueError(f"{owner}: field '{name}' must be a list of numpy arrays, one per layer")
    specs = []
    for i, array in enumerate(arrays):
        if not isinstance(array, np.ndarray):
            raise ValueError(f"{owner}: field '{name}[{i}]' must be a numpy array (got {type(array).__name__})")
        specs.append(KVSpec.of(array))
        _check_spec(f"{owner}: field '{name}[{i}]'", specs[-1], num_tokens)
    return tuple(specs)


def _check_spec(where: str, spec: KVSpec, num_tokens: int) -> None:
    if spec.dtype not in KV_DTYPES:
        raise ValueError(f"{where} must have a bool, int, uint or float dtype of at most 8 bytes (got {spec.dtype})")
    if len(spec.shape) < 1 or spec.shape[0] != num_tokens:
        raise ValueError(f"{where} must have shape [n, ...] with n = {num_tokens} prompt positions (those from "
                         f"kv_start on) (got {list(spec.shape)})")


@dataclass(frozen=True, slots=True)
class HandoffMessage:
    """What P sends D for one request. Build it with `create()` (KV inline) or `create_placed()` (KV written into
    D's blocks), which compute the tag; `decode()` reads one.

    The KV payload may be empty only when t0 terminates the request (P MAY skip the transfer then, PD_MTP_FLOW §4.4).
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]  # [L]
    sampling: HandoffSamplingParams
    t0: int
    draft_token_ids: tuple[int, ...]  # [t0, d1] with MTP; [t0] or [] without speculation
    kv_target: tuple[np.ndarray, ...]  # one per target layer, [L - kv_start, *layer_tail] (inline only)
    kv_mtp: tuple[np.ndarray, ...]  # one per MTP layer, [L - kv_start, *layer_tail] (inline only)
    config_hash: str
    tag: str
    version: int = PROTOCOL_VERSION
    keyed: bool = False  # the tag is keyed with the PD secret's hand-off key
    placed_kv: PlacedKV | None = None  # set for a placed hand-off (kv_target and kv_mtp are then empty)
    t0_logprobs: TokenLogprob | None = None  # t0's logprob and top-N on P; None unless the request asked
    kv_start: int = 0  # the KV covers positions kv_start..L-1: D's prefix cache holds the blocks before
    # (target, MTP) descriptors, derived once in __post_init__ (the header, the tag and the receipt read them)
    _specs: tuple = dataclasses.field(init=False, repr=False, compare=False, default=())
    _canon: bytes = dataclasses.field(init=False, repr=False, compare=False, default=b"")  # see canonical_header

    def __post_init__(self) -> None:
        owner = "HandoffMessage"
        set_ = object.__setattr__
        if self.version != PROTOCOL_VERSION:
            raise ValueError(f"{owner}: field 'version' must be {PROTOCOL_VERSION} (got {self.version!r})")
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"{owner}: field 'request_id' must be a non-empty str (got {self.request_id!r})")
        set_(self, "prompt_token_ids", require_ids(owner, "prompt_token_ids", self.prompt_token_ids))
        if not self.prompt_token_ids:
            raise ValueError(f"{owner}: field 'prompt_token_ids' must not be empty")
        if not isinstance(self.sampling, HandoffSamplingParams):
            raise ValueError(f"{owner}: field 'sampling' must be a HandoffSamplingParams")
        set_(self, "t0", require_int(owner, "t0", self.t0, minimum=0))
        set_(self, "draft_token_ids", require_ids(owner, "draft_token_ids", self.draft_token_ids))
        set_(self, "kv_start", require_int(owner, "kv_start", self.kv_start, minimum=0))
        if self.kv_start >= len(self.prompt_token_ids):
            raise ValueError(f"{owner}: field 'kv_start' must be < the {len(self.prompt_token_ids)} prompt tokens "
                             f"(got {self.kv_start})")
        num_tokens = len(self.prompt_token_ids) - self.kv_start   # positions whose KV the message carries
        specs = (_check_kv(owner, "kv_target", self.kv_target, num_tokens),
                 _check_kv(owner, "kv_mtp", self.kv_mtp, num_tokens))
        set_(self, "kv_target", tuple(self.kv_target))
        set_(self, "kv_mtp", tuple(self.kv_mtp))
        for name in ("config_hash", "tag"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{owner}: field '{name}' must be a str")
        if not isinstance(self.keyed, bool):
            raise ValueError(f"{owner}: field 'keyed' must be a bool")
        if self.placed_kv is not None:
            if not isinstance(self.placed_kv, PlacedKV):
                raise ValueError(f"{owner}: field 'placed_kv' must be a PlacedKV or None")
            if self.kv_target or self.kv_mtp:
                raise ValueError(f"{owner}: a placed hand-off carries no KV arrays (kv_target and kv_mtp empty)")
            for group in ("target", "mtp"):
                for i, spec in enumerate(getattr(self.placed_kv, group)):
                    _check_spec(f"{owner}: field 'placed_kv.{group}[{i}]'", spec, num_tokens)
            specs = (self.placed_kv.target, self.placed_kv.mtp)
        set_(self, "_specs", specs)
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
        key: HandoffKey | None = None,
        t0_logprobs: TokenLogprob | None = None,
        kv_start: int = 0,
        reused: bytes = b"",
    ) -> HandoffMessage:
        """Build a message with its KV inline on P and seal it (one pass over the header, the keys of the blocks D
        reused (`reused`, for positions 0..kv_start−1) and every KV byte)."""
        key = key or UNKEYED
        unsealed = cls(request_id, tuple(prompt_token_ids), sampling, t0, tuple(draft_token_ids),
                       tuple(kv_target), tuple(kv_mtp), config_hash, tag="", keyed=key.is_keyed,
                       t0_logprobs=t0_logprobs, kv_start=kv_start)
        return unsealed._sealed(unsealed.compute_tag(key, reused=reused))

    @classmethod
    def create_placed(
        cls,
        *,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: HandoffSamplingParams,
        t0: int,
        draft_token_ids: Sequence[int],
        placed_kv: PlacedKV,
        kv_chunks: Iterable[Buffer | np.ndarray],
        config_hash: str,
        key: HandoffKey | None = None,
        t0_logprobs: TokenLogprob | None = None,
        kv_start: int = 0,
        reused: bytes = b"",
    ) -> HandoffMessage:
        """Build a placed message (no KV frames) and seal it over `kv_chunks`: the bytes of positions
        kv_start..L−1 of every layer in order, read where they are (P's blocks). The iterable is consumed once, in
        order, so it may move each layer while the previous one is hashed."""
        key = key or UNKEYED
        unsealed = cls(request_id, tuple(prompt_token_ids), sampling, t0, tuple(draft_token_ids), (), (),
                       config_hash, tag="", keyed=key.is_keyed, placed_kv=placed_kv, t0_logprobs=t0_logprobs,
                       kv_start=kv_start)
        return unsealed._sealed(unsealed.compute_tag(key, kv_chunks, reused))

    @classmethod
    def create_streamed(cls, *, request_id: str, prompt_token_ids: Sequence[int], sampling: HandoffSamplingParams,
                        t0: int, draft_token_ids: Sequence[int], placed_kv: PlacedKV, config_hash: str,
                        key: HandoffKey | None = None, t0_logprobs: TokenLogprob | None = None,
                        kv_start: int = 0) -> HandoffMessage:
        """An unsealed placed message whose KV travels in pieces after its header (kv_stream.py): the stream's
        trailer carries the tag, computed while the pieces are sent."""
        return cls(request_id, tuple(prompt_token_ids), sampling, t0, tuple(draft_token_ids), (), (), config_hash,
                   tag="", keyed=(key or UNKEYED).is_keyed, placed_kv=placed_kv, t0_logprobs=t0_logprobs,
                   kv_start=kv_start)

    def _sealed(self, tag: str) -> HandoffMessage:
        # Only on a message create() has just built and nobody else has seen: no second validation pass.
        object.__setattr__(self, "tag", tag)
        return self

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def kv_inline(self) -> bool:
        """The KV bytes travel in the message (else they were placed in D's blocks)."""
        return self.placed_kv is None

    @property
    def has_kv(self) -> bool:
        target, mtp = self.kv_specs()
        return bool(target or mtp)

    def kv_specs(self) -> tuple[tuple[KVSpec, ...], tuple[KVSpec, ...]]:
        """(target, MTP) descriptors of the KV arrays, inline or placed."""
        return self._specs

    @property
    def kv_nbytes(self) -> int:
        target, mtp = self.kv_specs()
        return sum(spec.nbytes for spec in target + mtp)

    def compute_tag(self, key: HandoffKey | None = None, kv_chunks: Iterable[Buffer | np.ndarray] | None = None,
                    reused: bytes = b"") -> str:
        """The tag this message's content should carry (PD_MTP_FLOW §3): one pass over the header, `reused` (the
        prefix-cache keys of the blocks before `kv_start`, as the side computing the tag knows them) and the KV
        bytes (the inline arrays, or `kv_chunks` for a placed message). ValueError when the chunks' byte count
        differs from what the descriptors say."""
        expected = self.kv_nbytes
        if self.placed_kv is None:
            chunks: Iterable = coalesce(self.kv_target + self.kv_mtp)
            largest = expected               # P gathered the layers into one buffer: one update
        elif kv_chunks is None:
            raise ValueError(f"HandoffMessage.compute_tag: request {self.request_id}: a placed hand-off needs "
                             "'kv_chunks' (the bytes of the blocks it was placed in)")
        else:
            chunks = kv_chunks
            target, mtp = self.kv_specs()
            largest = max((spec.nbytes for spec in target + mtp), default=0)   # a chunk is a layer at most
        hasher = (key or UNKEYED).hasher(self.canonical_header(), largest, reused).update_all(chunks)
        if hasher.num_bytes != expected:
            raise ValueError(f"HandoffMessage.compute_tag: request {self.request_id}: {hasher.num_bytes} KV bytes "
                             f"for descriptors of {expected}")
        return hasher.hexdigest()

    def encode(self) -> bytes:
        return b"".join(self.encode_frames())

    def encode_frames(self) -> list[bytes | memoryview]:
        """The wire format cut into frames: prefix + header, then each inline KV array's bytes (views)."""
        header = self._tagged_header()
        frames: list[bytes | memoryview] = [PREFIX.pack(MAGIC, self.version, len(header)) + header]
        frames.extend(coalesce(np.ascontiguousarray(a) for a in self.kv_target + self.kv_mtp))
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
        header_len = read_prefix(view)
        body_start = PREFIX.size + header_len
        if len(view) < body_start:
            raise HandoffDecodeError(
                f"handoff decode: truncated message: header needs {header_len} bytes, "
                f"{len(view) - PREFIX.size} present")
        raw_header = bytes(view[PREFIX.size:body_start])
        try:
            header = json.loads(raw_header.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:   # a peer's bytes: any nesting
            raise HandoffDecodeError(f"handoff decode: header is not valid JSON: {exc}") from exc
        message = cls._from_header(header, view, body_start, frames)
        # Only the canonical spelling is accepted ('<f4' not '=f4', no spaces, '1e-05' not '1E-05'), so that any
        # change to the header bytes changes a decoded value and therefore the tag.
        if message._tagged_header() != raw_header:
            raise HandoffDecodeError("handoff decode: header is not in canonical form")
        return message

    def canonical_header(self) -> bytes:
        """The canonical JSON of the header without its tag (what the tag covers), encoded once per message (a long
        prompt makes it tens of KB)."""
        if not self._canon:
            object.__setattr__(self, "_canon", canonical_json(self._header(with_tag=False)))
        return self._canon

    def _tagged_header(self) -> bytes:
        """The canonical header with the tag: "tag" sorts after every other key, so it is the untagged header with
        the tag appended (equal to canonical_json(self._header(with_tag=True)))."""
        return self.canonical_header()[:-1] + b',"tag":' + canonical_json(self.tag) + b"}"

    def _header(self, *, with_tag: bool) -> dict[str, Any]:
        target, mtp = self.kv_specs()
        header = {
            "request_id": self.request_id,
            "prompt_token_ids": list(self.prompt_token_ids),
            "sampling": self.sampling.to_json(),
            "t0": self.t0,
            "draft_token_ids": list(self.draft_token_ids),
            "config_hash": self.config_hash,
            "keyed": self.keyed,
            "kv": {
                "inline": self.kv_inline,
                "target": [spec.to_json() for spec in target],
                "mtp": [spec.to_json() for spec in mtp],
            },
        }
        if self.t0_logprobs is not None:
            entry = self.t0_logprobs
            header["t0_logprobs"] = {"logprob": entry.logprob, "top_token_ids": list(entry.top_token_ids),
                                     "top_logprobs": list(entry.top_logprobs)}
        if self.kv_start:
            header["kv_start"] = self.kv_start
        if with_tag:
            header["tag"] = self.tag
        return header

    @classmethod
    def _from_header(cls, header: object, view: memoryview, body_start: int,
                     frames: list[memoryview] | None) -> HandoffMessage:
        keys = {"request_id", "prompt_token_ids", "sampling", "t0", "draft_token_ids", "config_hash", "keyed", "kv",
                "tag"}
        if not isinstance(header, dict) or not keys <= set(header) <= keys | {"t0_logprobs", "kv_start"}:
            got = sorted(header) if isinstance(header, dict) else type(header).__name__
            raise HandoffDecodeError(f"handoff decode: header must have keys {sorted(keys)} and optionally "
                                     f"'kv_start', 't0_logprobs' (got {got})")
        kv = header["kv"]
        if not isinstance(kv, dict) or set(kv) != {"inline", "target", "mtp"}:
            raise HandoffDecodeError("handoff decode: field 'kv' must have keys ['inline', 'mtp', 'target']")
        for name, value in (("kv.inline", kv["inline"]), ("keyed", header["keyed"])):
            if not isinstance(value, bool):
                raise HandoffDecodeError(f"handoff decode: field '{name}' must be a bool")
        for group in ("target", "mtp"):
            if not isinstance(kv[group], list):
                raise HandoffDecodeError(f"handoff decode: field 'kv.{group}' must be a list")
        specs = {group: [parse_spec(desc, f"kv.{group}[{i}]") for i, desc in enumerate(kv[group])]
                 for group in ("target", "mtp")}
        named = [(f"kv.{group}[{i}]", spec) for group in ("target", "mtp") for i, spec in enumerate(specs[group])]
        arrays = _read_arrays(named, view, body_start, frames, inline=kv["inline"])
        split = len(specs["target"])
        placed = None if kv["inline"] else PlacedKV(tuple(specs["target"]), tuple(specs["mtp"]))
        try:
            return cls(
                request_id=header["request_id"],
                prompt_token_ids=header["prompt_token_ids"],
                sampling=HandoffSamplingParams.from_json(header["sampling"]),
                t0=header["t0"],
                draft_token_ids=header["draft_token_ids"],
                kv_target=tuple(arrays[:split]),
                kv_mtp=tuple(arrays[split:]),
                config_hash=header["config_hash"],
                tag=header["tag"],
                keyed=header["keyed"],
                placed_kv=placed,
                t0_logprobs=_read_t0_logprobs(header),
                kv_start=header.get("kv_start", 0),
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


def _read_arrays(named: list[tuple[str, KVSpec]], view: memoryview, body_start: int,
                 frames: list[memoryview] | None, *, inline: bool) -> list[np.ndarray]:
    """The inline KV arrays after the header (bytes form) or in frames 1.. (framed form: each frame holds one or
    more whole arrays, in order, and no frame is empty); none when placed."""
    if frames is None:
        data, read, offset = np.frombuffer(view, np.uint8), [], body_start
        for name, spec in (named if inline else []):
            array, offset = read_array(data, offset, spec, name)
            read.append(array)
        if offset != len(view):
            raise HandoffDecodeError(
                f"handoff decode: {len(view) - offset} unexpected trailing bytes after the KV payload")
        return read
    if body_start != len(view):
        raise HandoffDecodeError(
            f"handoff decode: {len(view) - body_start} unexpected bytes after the header in frame 0")
    if frames and not inline:
        raise HandoffDecodeError(f"handoff decode: {len(frames)} KV frames for a placed hand-off (none expected)")
    if any(len(frame) == 0 for frame in frames):
        raise HandoffDecodeError("handoff decode: an empty KV frame")
    datas = [np.frombuffer(frame, np.uint8) for frame in frames]
    read, index, offset = [], 0, 0
    for name, spec in (named if inline else []):
        if spec.nbytes and index < len(datas) and offset == len(datas[index]):
            index, offset = index + 1, 0   # the previous frame is used up: this array starts the next one
        if spec.nbytes and index == len(datas):
            raise HandoffDecodeError(f"handoff decode: '{name}' has no frame ({len(frames)} KV frames for "
                                     f"{len(named)} arrays)")
        data = datas[index] if index < len(datas) else np.empty(0, np.uint8)
        array, offset = read_array(data, offset, spec, name)
        read.append(array)
    if datas and (index != len(datas) - 1 or offset != len(datas[-1])):
        raise HandoffDecodeError(f"handoff decode: the KV frames hold bytes after the described arrays "
                                 f"({len(frames)} frames, {len(named)} arrays)")
    return read
