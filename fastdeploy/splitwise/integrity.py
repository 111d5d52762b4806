"""Digests that let D detect a mismatched, corrupted or forged hand-off (PD_MTP_FLOW §3 row "Integrity", PD_MTP_FLOW
§5.2 step 1).

`config_hash` identifies everything P and D must agree on to exchange KV and drafts (compare vLLM's connector
compatibility hash). The hand-off tag is one BLAKE3 pass over a hand-off's canonical header, the prefix-cache keys
of the blocks D reused instead of receiving them (PD_MTP_FLOW §13.6; none unless D's cache held a prefix), and then
every KV byte in order (PD_MTP_FLOW §3, the project's decision): keyed with a key derived from the PD secret
(BLAKE3 derive-key mode, `HANDOFF_TAG_CONTEXT`) when the deployment has one, so a peer without the secret cannot
have a hand-off accepted; plain BLAKE3 without a secret, which detects accidents only. `TagHasher` computes it
incrementally, so the KV bytes can be fed where they already are (a received frame, a cache block).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable, Mapping

import blake3
import numpy as np

from fastdeploy.config import TRANSFER_PROTOCOLS

# Version of the hand-off wire format, of the connector's messages and of what the digests cover. Bump it
# whenever any of them changes; peers of different versions refuse each other, naming both versions.
PROTOCOL_VERSION = 6   # 6: the sampling controls in HandoffSamplingParams

# The transports a P and a D may exchange KV over; both must use the same one (it is part of config_hash).
TRANSPORTS = TRANSFER_PROTOCOLS   # the names config_hash accepts for `transport`

# BLAKE3 derive-key contexts ("application, date, purpose"): each purpose gets its own key from one secret.
HANDOFF_TAG_CONTEXT = "fastdeploy-pd 2026-12-01 hand-off tag v2"
CONFIG_HASH_CONTEXT = "fastdeploy-pd 2026-12-01 configuration hash v2"

TAG_BYTES = 16
# BLAKE3 spreads an update over threads only when it is large enough to pay for them (measured on the development
# machine: slower below a few MiB, up to 1.3 x faster for one 128 MiB update on two cores; a stream of 1 MiB pieces
# hashed with threads took 2-3 x longer while the socket's copies wanted the same two cores).
_THREADED_HASH_BYTES = 8 << 20


def canonical_json(value: object) -> bytes:
    """Deterministic JSON (sorted keys, no spaces, ASCII) so that equal values always hash equally."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _require_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config_hash: argument '{name}' must be an int > 0 (got {value!r})")


def config_hash(
    *,
    model_name: str,
    vocab_size: int,
    num_speculative_tokens: int,
    mtp_model: str | None,
    block_size: int,
    kv_dtype: str,
    protocol_version: int = PROTOCOL_VERSION,
    transport: str = "zmq",
    max_model_len: int | None = None,
    tokenizer: str = "",
    chat_template: str = "",
) -> str:
    """Hash of the configuration a P instance and a D instance must share.

    `mtp_model` names the MTP module's identity (None without speculation, then K must be 0); `transport` is one of
    TRANSPORTS. Everything that changes what the KV bytes, the draft ids or the wire format mean, or how the KV
    travels, is covered; so is what makes one request body tokenize or template differently, or fit differently
    (`max_model_len`, the `tokenizer`'s and the `chat_template`'s identities: P and D must turn one body into the
    same prompt ids, docs/design.md §8); nothing per-request is.
    """
    _require_positive("vocab_size", vocab_size)
    _require_positive("block_size", block_size)
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) \
            or num_speculative_tokens < 0:
        raise ValueError(
            f"config_hash: argument 'num_speculative_tokens' must be an int >= 0 (got {num_speculative_tokens!r})")
    if (mtp_model is None) != (num_speculative_tokens == 0):
        raise ValueError(
            "config_hash: argument 'mtp_model' must be given exactly when num_speculative_tokens >= 1 "
            f"(got mtp_model={mtp_model!r}, num_speculative_tokens={num_speculative_tokens})")
    for name, value in (("model_name", model_name), ("kv_dtype", kv_dtype)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"config_hash: argument '{name}' must be a non-empty str (got {value!r})")
    if transport not in TRANSPORTS:
        raise ValueError(f"config_hash: argument 'transport' must be one of {list(TRANSPORTS)} (got {transport!r})")
    fields = {
        "block_size": block_size,
        "chat_template": chat_template,
        "kv_dtype": kv_dtype,
        "max_model_len": max_model_len,
        "model_name": model_name,
        "mtp_model": mtp_model,
        "num_speculative_tokens": num_speculative_tokens,
        "protocol_version": protocol_version,
        "tokenizer": tokenizer,
        "transport": transport,
        "vocab_size": vocab_size,
    }
    return blake3.blake3(canonical_json(fields), derive_key_context=CONFIG_HASH_CONTEXT).hexdigest(TAG_BYTES)


def derive_key(secret: bytes, context: str) -> bytes:
    """The 32-byte BLAKE3 key for one purpose (`context`) derived from the PD secret."""
    if not isinstance(secret, (bytes, bytearray)) or not secret:
        raise ValueError("derive_key: argument 'secret' must be non-empty bytes")
    return blake3.blake3(bytes(secret), derive_key_context=context).digest()


class HandoffKey:
    """The key of the hand-off tag: derived from the PD secret, or none (then the tag is plain BLAKE3)."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes | None = None):
        if key is not None and (not isinstance(key, bytes) or len(key) != 32):
            raise ValueError("HandoffKey: argument 'key' must be 32 bytes or None")
        self._key = key

    @classmethod
    def from_secret(cls, secret: bytes | None) -> HandoffKey:
        return cls(None if secret is None else derive_key(secret, HANDOFF_TAG_CONTEXT))

    @property
    def is_keyed(self) -> bool:
        return self._key is not None

    def hasher(self, fields: Mapping[str, object] | bytes, largest_update: int = 0,
               reused: bytes = b"") -> TagHasher:
        """A running tag over `fields` (the header without its tag, or its canonical JSON already encoded) and
        `reused` (the prefix-cache keys of the blocks D reused instead of receiving them); feed the KV bytes next,
        in updates of at most about `largest_update` bytes (large ones are hashed on several threads)."""
        header = fields if isinstance(fields, bytes) else canonical_json(dict(fields))
        return TagHasher(self._key, header, largest_update, reused)


UNKEYED = HandoffKey()


class TagHasher:
    """One pass of the hand-off tag: the header's length and bytes, the reused blocks' keys (their length, then
    the keys: empty when D reused none), then KV bytes in order (`update`)."""

    __slots__ = ("_hasher", "num_bytes")

    def __init__(self, key: bytes | None, header: bytes, largest_update: int = 0, reused: bytes = b""):
        threads = blake3.blake3.AUTO if largest_update >= _THREADED_HASH_BYTES else 1
        self._hasher = blake3.blake3(key=key, max_threads=threads) if key is not None \
            else blake3.blake3(max_threads=threads)
        # The length first: the header and the KV bytes cannot trade bytes without changing the tag.
        self._hasher.update(len(header).to_bytes(8, "little"))
        self._hasher.update(header)
        self._hasher.update(len(reused).to_bytes(8, "little"))
        self._hasher.update(reused)
        self.num_bytes = 0  # KV bytes fed so far

    def update(self, data: np.ndarray | memoryview | bytes) -> None:
        view = byte_view(data)
        self._hasher.update(view)
        self.num_bytes += view.nbytes

    def update_all(self, chunks: Iterable[np.ndarray | memoryview | bytes]) -> TagHasher:
        for chunk in chunks:
            self.update(chunk)
        return self

    def hexdigest(self) -> str:
        return self._hasher.hexdigest(TAG_BYTES)


def byte_view(data: np.ndarray | memoryview | bytes) -> memoryview:
    """A flat unsigned-byte view of `data` (C-contiguous arrays and buffers; no copy)."""
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise ValueError("byte_view: the array must be C-contiguous (hashing must not copy it)")
        return memoryview(data.reshape(-1).view(np.uint8))
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def coalesce(chunks: Iterable[np.ndarray | memoryview | bytes]) -> list[memoryview]:
    """Byte views of `chunks` in order, with consecutive arrays that lie back to back in one buffer merged into one
    view (fewer, larger hash updates and frames: P gathers a hand-off's layers into one buffer, D decodes them from
    one frame); empty chunks are dropped. No copy."""
    views: list[memoryview] = []
    root, start, end = None, 0, 0

    def flush() -> None:
        if root is not None:
            views.append(memoryview(root.reshape(-1).view(np.uint8))[start:end])

    for chunk in chunks:
        if isinstance(chunk, np.ndarray) and chunk.flags.c_contiguous:
            if not chunk.nbytes:
                continue
            owner = chunk
            while isinstance(owner.base, np.ndarray):
                owner = owner.base
            if owner.flags.c_contiguous:
                offset = chunk.ctypes.data - owner.ctypes.data
                if owner is root and offset == end:
                    end += chunk.nbytes
                else:
                    flush()
                    root, start, end = owner, offset, offset + chunk.nbytes
                continue
        flush()
        root = None
        view = byte_view(chunk)
        if view.nbytes:
            views.append(view)
    flush()
    return views


def integrity_tag(fields: Mapping[str, object], kv_arrays: Iterable[np.ndarray | memoryview | bytes],
                  key: HandoffKey | None = None, reused: bytes = b"") -> str:
    """The hand-off tag over `fields` (JSON-serialisable, including each array's dtype and shape, so that
    reinterpreting the same bytes under another shape changes the tag too), the reused blocks' keys and the KV
    bytes, in order."""
    views = coalesce(kv_arrays)
    largest = max((v.nbytes for v in views), default=0)
    return (key or UNKEYED).hasher(fields, largest, reused).update_all(views).hexdigest()


def tags_equal(received: object, expected: str) -> bool:
    """Constant-time comparison: a keyed tag must not leak how many leading characters matched. Compared as
    UTF-8 bytes, so a received tag with any characters (a peer's) is a mismatch, never an error."""
    if not isinstance(received, str):
        return False
    return hmac.compare_digest(received.encode("utf-8", "surrogatepass"), expected.encode())
