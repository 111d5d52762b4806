"""What the two PD halves share: the KV port each side is given, the compatibility hash and `disaggregate_info`.

PD_MTP_FLOW §3 and SERVICES §6. Nothing here imports paddle.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fastdeploy.config import FDConfig
from fastdeploy.splitwise import KVLayout, config_hash

# How long an idle instance waits for a message from its peer in one step (real time, or virtual time in tests).
IDLE_POLL_S = 0.01

_ADDRESS = re.compile(r"^[A-Za-z0-9._\-\[\]:]+:\d{1,5}$")


class KVPort(Protocol):
    """One instance's KV cache as the hand-off sees it (fastdeploy/worker/kv_transfer.py)."""

    layout: KVLayout

    def read_prompt_kv(self, block_ids: Sequence[int],
                       num_tokens: int) -> tuple[list[np.ndarray], list[np.ndarray]]: ...

    def write_prompt_kv(self, block_ids: Sequence[int], kv_target: Sequence[np.ndarray],
                        kv_mtp: Sequence[np.ndarray]) -> None: ...


def instance_config_hash(config: FDConfig, vocab_size: int) -> str:
    """The PD_MTP_FLOW §3 compatibility hash of one instance: P's and D's must be equal."""
    k = config.num_speculative_tokens
    return config_hash(model_name=config.model, vocab_size=vocab_size, num_speculative_tokens=k,
                       mtp_model=f"{config.model}/mtp" if k else None, block_size=config.cache.block_size,
                       kv_dtype=config.dtype)


def _check_address(field: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _ADDRESS.match(value) or not 0 < int(value.rsplit(":", 1)[1]) < 65536:
        raise ValueError(f"disaggregate_info: field '{field}' must be a 'host:port' string (got {value!r})")
    return value


@dataclass(slots=True, frozen=True)
class DisaggregateInfo:
    """Where a PD request's other half runs (SERVICES §6): the router puts it in both HTTP bodies."""

    request_id: str
    prefill_addr: str | None = None     # P's connector (D sends its reservation and acks there)
    decode_addr: str | None = None      # D's connector (informational: D connects to P, docs/design.md §8)

    @classmethod
    def parse(cls, value: object, request_id: str) -> DisaggregateInfo:
        """Validate the opaque dict from the HTTP body; ValueError naming the field. None: in-process PD."""
        if value is None:
            return cls(request_id)
        if not isinstance(value, dict):
            raise ValueError(f"disaggregate_info: must be an object (got {type(value).__name__})")
        unknown = set(value) - {"request_id", "prefill_addr", "decode_addr"}
        if unknown:
            raise ValueError(f"disaggregate_info: unknown field(s) {sorted(unknown)}")
        rid = value.get("request_id", request_id)
        if rid != request_id:
            raise ValueError(f"disaggregate_info: field 'request_id' is {rid!r}, the request's id is "
                             f"{request_id!r}")
        return cls(request_id, _check_address("prefill_addr", value.get("prefill_addr")),
                   _check_address("decode_addr", value.get("decode_addr")))
