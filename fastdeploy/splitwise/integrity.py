"""Digests that let D detect a mismatched or corrupted hand-off (PD_MTP_FLOW §3 row "Integrity", PD_MTP_FLOW §5.2 step
1).

`config_hash` identifies everything P and D must agree on to exchange KV and drafts (compare vLLM's connector
compatibility hash); `integrity_tag` is the per-transfer digest over one hand-off's content. Both are BLAKE2b,
128-bit, hex. They detect accidents (wrong peer, flipped bits, truncation), not an attacker: there is no key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

import numpy as np

# Version of the hand-off wire format and of what the digests cover. Bump it whenever either changes.
PROTOCOL_VERSION = 1

_DIGEST_BYTES = 16


def canonical_json(value: object) -> bytes:
    """Deterministic JSON (sorted keys, no spaces, ASCII) so that equal values always hash equally."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def config_hash(
    *,
    model_name: str,
    vocab_size: int,
    num_speculative_tokens: int,
    mtp_model: str | None,
    block_size: int,
    kv_dtype: str,
    protocol_version: int = PROTOCOL_VERSION,
) -> str:
    """Hash of the configuration a P instance and a D instance must share.

    `mtp_model` names the MTP module's identity (None without speculation, then K must be 0). Everything that
    changes what the KV bytes, the draft ids or the wire format mean is covered; nothing per-request is.
    """
    for name, value in (("vocab_size", vocab_size), ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"config_hash: argument '{name}' must be an int > 0 (got {value!r})")
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
    fields = {
        "block_size": block_size,
        "kv_dtype": kv_dtype,
        "model_name": model_name,
        "mtp_model": mtp_model,
        "num_speculative_tokens": num_speculative_tokens,
        "protocol_version": protocol_version,
        "vocab_size": vocab_size,
    }
    return hashlib.blake2b(canonical_json(fields), digest_size=_DIGEST_BYTES, person=b"fd-pd-config").hexdigest()


def integrity_tag(fields: Mapping[str, object], kv_arrays: Sequence[np.ndarray]) -> str:
    """Per-transfer tag: digest over a hand-off's fields (request id, t0, draft ids, ...) and its KV bytes.

    `fields` must be JSON-serialisable and include each array's dtype and shape, so that reinterpreting the same
    bytes under another shape also changes the tag. Arrays are hashed in order, as C-contiguous bytes.
    """
    digest = hashlib.blake2b(canonical_json(fields), digest_size=_DIGEST_BYTES, person=b"fd-pd-handoff")
    for array in kv_arrays:
        digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()
