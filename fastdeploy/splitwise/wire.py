"""The byte layout of wire format v2: the fixed prefix, the KV dtype table and KV array descriptors (PD_MTP_FLOW §3).

    b"FDPD" | u16 protocol version | u32 header length H | H bytes of UTF-8 JSON header | KV bytes

The version sits in the fixed prefix so that a peer on another version is named before anything else is parsed.
Received dtype text is looked up in a fixed table, never passed to `np.dtype()`; arrays read from received bytes
are read-only views into them (no copy). In the framed form (one buffer per frame) frame 0 is the prefix and the
header, and the KV frames that follow are the KV bytes cut at array boundaries: each frame holds one or more whole
arrays, in order (a sender sends a buffer of several consecutive arrays as one frame).
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from fastdeploy.splitwise.integrity import PROTOCOL_VERSION

Buffer = Union[bytes, bytearray, memoryview]
MAGIC = b"FDPD"
PREFIX = struct.Struct("<4sHI")  # magic, protocol version, header length
# The KV dtypes the wire format can carry, by their canonical `dtype.str` ('<f4', '>f4', '|b1', ...): numeric
# kinds only (bfloat16 caches travel as their uint16 bit patterns).
KV_DTYPES = {
    np.dtype(name).newbyteorder(order).str: np.dtype(name).newbyteorder(order)
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64")
    for order in "<>"
}


class HandoffDecodeError(ValueError):
    """The bytes are not a hand-off this build can read: bad magic, another version, truncated or malformed."""


@dataclass(frozen=True, slots=True)
class KVSpec:
    """One KV array as the header describes it: `dtype.str` (byte order kept, '<f4') and shape [L, *tail]."""

    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, array: np.ndarray) -> KVSpec:
        return cls(array.dtype.str, array.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * KV_DTYPES[self.dtype].itemsize

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}


def read_prefix(view: memoryview) -> int:
    """Check the fixed prefix of a received hand-off; returns the header length."""
    if len(view) < PREFIX.size:
        raise HandoffDecodeError(
            f"handoff decode: truncated message: {len(view)} bytes, the fixed prefix alone is {PREFIX.size}")
    magic, version, header_len = PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise HandoffDecodeError(f"handoff decode: bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != PROTOCOL_VERSION:
        raise HandoffDecodeError(
            f"handoff decode: the peer sent wire format version {version}; this build reads version "
            f"{PROTOCOL_VERSION} only (upgrade P and D together)")
    return header_len


def parse_spec(desc: object, name: str) -> KVSpec:
    """A received `{"dtype", "shape"}` descriptor, validated."""
    if not isinstance(desc, dict) or set(desc) != {"dtype", "shape"}:
        raise HandoffDecodeError(f"handoff decode: field '{name}' must be {{'dtype', 'shape'}}")
    shape = desc["shape"]
    if not isinstance(shape, list) or not shape or \
            any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise HandoffDecodeError(f"handoff decode: field '{name}.shape' must be a non-empty list of ints >= 0")
    if not isinstance(desc["dtype"], str) or desc["dtype"] not in KV_DTYPES:
        raise HandoffDecodeError(f"handoff decode: field '{name}.dtype' is not a numeric dtype: {desc['dtype']!r}")
    return KVSpec(desc["dtype"], tuple(shape))


def read_array(data: np.ndarray, offset: int, spec: KVSpec, name: str) -> tuple[np.ndarray, int]:
    """The array `spec` describes at byte `offset` of `data` (a 1-D uint8 array over the received bytes): a
    read-only view, no copy; and the offset past it. Arrays read from one `data` share it as their base, so that
    consecutive ones can be hashed or sent as one span (integrity.coalesce)."""
    dtype = KV_DTYPES[spec.dtype]
    end = offset + math.prod(spec.shape) * dtype.itemsize  # Python ints: a forged huge shape cannot overflow
    if end > len(data):
        raise HandoffDecodeError(
            f"handoff decode: truncated message: '{name}' needs bytes [{offset}, {end}), only {len(data)} present")
    array = data[offset:end].view(dtype).reshape(spec.shape)
    array.flags.writeable = False  # also when the caller passed a bytearray: D must not write into P's bytes
    return array, end
