"""The KV cache's memory budget of one instance in bytes, and where that figure comes from (docs/design.md §3 "KV
budget"); also how `fastdeploy serve --pd` shares one host's budget among its instances.

Nothing here imports Paddle: the API server and `serve --pd` size instances before any model is loaded.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# The budget when no flag gives one: a fixed space, as vLLM's CPU backend (VLLM_CPU_KVCACHE_SPACE, GiB). Fixed,
# not a probe of free memory, so the same flags size the same cache on every machine (PD pairs rely on it).
DEFAULT_KV_CACHE_BYTES = 4 * 2 ** 30
# `serve --pd` on one host: the default budget of the whole deployment (every instance's share together)
DEFAULT_PD_HOST_KV_CACHE_BYTES = 4 * 2 ** 30
_UNITS = {"": 1, "k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class KVBudget:
    bytes: int
    source: str     # what the start line says the figure comes from, e.g. "--kv-cache-memory-bytes 1.0 GiB"


def parse_bytes(text: str | int, flag: str = "--kv-cache-memory-bytes") -> int:
    """A size in bytes: an int, or a number with a binary unit (K, M, G, T; "KiB", "GB" read the same: powers of
    1024). ValueError naming `flag` otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE.fullmatch(str(text))
        if match is None:
            raise ValueError(f"{flag}: expected a size such as 2147483648, 512M or 2GiB, got {text!r}")
        value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value < 1:
        raise ValueError(f"{flag}: must be at least 1 byte, got {text!r}")
    return value


def gib(value: int) -> str:
    """A size as a person reads it: "160.0 KiB", "512.0 MiB", "1.33 GiB"."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}" if unit == "GiB" else f"{value / scale:.1f} {unit}"
    return f"{value} B"


def host_memory_bytes() -> int | None:
    """MemTotal of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def resolve_budget(memory_bytes: int | None, utilization: float | None, weight_bytes: int,
                   host_bytes: int | None = None) -> KVBudget:
    """The KV budget: `memory_bytes` when given (--kv-cache-memory-bytes); else, with `utilization`
    (FastDeploy's --gpu-memory-utilization: the share of the device's memory for weights and KV together; the
    device is the host here), that share of the host's MemTotal less `weight_bytes`; else the default space.
    ValueError when the share leaves nothing for the KV cache."""
    if memory_bytes is not None:
        return KVBudget(memory_bytes, f"--kv-cache-memory-bytes {gib(memory_bytes)}")
    if utilization is None:
        return KVBudget(DEFAULT_KV_CACHE_BYTES, f"the default KV space {gib(DEFAULT_KV_CACHE_BYTES)} (set it with "
                                                f"--kv-cache-memory-bytes or --gpu-memory-utilization)")
    host = host_memory_bytes() if host_bytes is None else host_bytes
    if host is None:
        raise ValueError("--gpu-memory-utilization: this host reports no MemTotal; give --kv-cache-memory-bytes")
    left = int(utilization * host) - weight_bytes
    if left < 1:
        raise ValueError(f"--gpu-memory-utilization {utilization:g}: {gib(int(utilization * host))} of the host's "
                         f"{gib(host)} leaves nothing for the KV cache after the weights ({gib(weight_bytes)}); "
                         f"raise it or give --kv-cache-memory-bytes")
    return KVBudget(left, f"--gpu-memory-utilization {utilization:g} of the host's {gib(host)} less "
                          f"{gib(weight_bytes)} of weights")


def split_host_budget(total: int, num_prefill: int, prefill_slots: int, num_decode: int,
                      decode_slots: int) -> tuple[int, int]:
    """Each prefill's and each decode instance's share of `total` bytes, in proportion to their slots: a P holds
    the KV of the prompts it has in flight (up to its slots, until D has taken them), a D the whole context of
    each of its slots; so one D with twice P's slots gets twice P's share."""
    for name, value in (("num_prefill", num_prefill), ("prefill_slots", prefill_slots),
                        ("num_decode", num_decode), ("decode_slots", decode_slots)):
        if value < 1:
            raise ValueError(f"split_host_budget: argument '{name}' must be >= 1, got {value}")
    unit = total / (num_prefill * prefill_slots + num_decode * decode_slots)
    return int(unit * prefill_slots), int(unit * decode_slots)
