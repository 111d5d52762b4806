"""Maps sglang-router's view of an instance onto this server's (docs/design.md §8, "sglang-router").

Two parts: the bootstrap fields sglang-router adds to both bodies of a PD request become the engine's
`disaggregate_info` (`bootstrap_pairing`), and the probe endpoints it reads at registration answer from the flags
(`server_info`, `model_info`).
"""
from __future__ import annotations

import argparse
import ipaddress

from fastdeploy.entrypoints.openai.errors import APIError
from fastdeploy.entrypoints.openai.protocol import SamplingFields
from fastdeploy.entrypoints.openai.serve_args import config_from_args
from fastdeploy.schema.pairing import host_error, peer_address_error

BOOTSTRAP_FIELDS = ("bootstrap_room", "bootstrap_host", "bootstrap_port")
ROOM_ID_PREFIX = "sglang-room-"


def bootstrap_given(request: SamplingFields) -> list[str]:
    """The bootstrap fields the body sets, in BOOTSTRAP_FIELDS order."""
    return [name for name in BOOTSTRAP_FIELDS if getattr(request, name) is not None]


def bootstrap_pairing(request: SamplingFields, own_connector_port: int | None) -> dict:
    """The `disaggregate_info` of a request sglang-router paired (400 naming the field otherwise). P and D get the
    same body, so both derive the same engine id from the room (the first room when the router sent one per prompt
    or sample; several choices then take `<id>-<index>` as always), and D reaches P's connector at
    `bootstrap_host:bootstrap_port`. On P, `own_connector_port` (its --pd-comm-port) must be that port: a router
    given another bootstrap port would leave D reserving at an address no P listens on."""
    given = bootstrap_given(request)
    missing = [name for name in BOOTSTRAP_FIELDS if name not in given]
    if missing:
        raise APIError(400, f"field '{missing[0]}' is required with '{given[0]}': SGLang pairing sets "
                            "bootstrap_host, bootstrap_port and bootstrap_room together", param=missing[0])
    values = {name: _as_list(getattr(request, name)) for name in BOOTSTRAP_FIELDS}
    if len({len(v) for v in values.values()}) > 1:
        raise APIError(400, "fields 'bootstrap_host', 'bootstrap_port' and 'bootstrap_room' must be lists of the "
                            "same length (or all single values)", param="bootstrap_room")
    for name in ("bootstrap_host", "bootstrap_port"):
        if len(set(values[name])) > 1:
            raise APIError(400, f"field '{name}': every entry must name the same prefill instance (one request "
                                "is paired with one P)", param=name)
    host, port = _connector_host(values["bootstrap_host"][0]), values["bootstrap_port"][0]
    if own_connector_port is not None and port != own_connector_port:
        raise APIError(400, f"field 'bootstrap_port': {port} is not this prefill instance's connector port "
                            f"({own_connector_port}, --pd-comm-port); give sglang-router "
                            f"'--prefill <this URL> {own_connector_port}'", param="bootstrap_port")
    return {"request_id": f"{ROOM_ID_PREFIX}{values['bootstrap_room'][0]}", "prefill_addr": f"{host}:{port}"}


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _connector_host(host: str) -> str:
    """`host` as the host part of a P's connector address (schema/pairing.py): an IPv4 address, or an IPv6
    address, bare or in brackets (SGLang passes it bare); no host name."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        host = f"[{ipaddress.IPv6Address(bare)}]"
    except ValueError:
        pass
    why = host_error(host) or peer_address_error(f"{host}:1")   # D connects to IP literals only (pairing.py)
    if why is not None:
        raise APIError(400, f"field 'bootstrap_host': {why} (give sglang-router P's URL with an IP address)",
                       param="bootstrap_host")
    return host


def connector_port(ready_info: dict) -> int | None:
    """The port of this instance's connector (`host:port` in the engine core's Ready info), None before ready."""
    address = ready_info.get("connector_addr")
    return int(address.rsplit(":", 1)[1]) if address else None


def server_info(args: argparse.Namespace, model_name: str, ready_info: dict, version: str) -> dict:
    """SGLang's `/server_info` fields that sglang-router reads, from this instance's flags. `model_path` and
    `tokenizer_path` are null: the embedded models have no Hugging Face files, and sglang-router tries to download
    a tokenizer from any path it is given. `served_model_name` becomes the router's model id."""
    config = config_from_args(args)
    role = args.splitwise_role
    return {"model_path": None, "tokenizer_path": None, "served_model_name": model_name, "is_generation": True,
            "disaggregation_mode": role if role != "mixed" else "null",
            "disaggregation_bootstrap_port": connector_port(ready_info) if role == "prefill" else None,
            "tp_size": 1, "dp_size": 1, "page_size": config.cache.block_size,
            "max_total_num_tokens": config.cache.num_kv_blocks * config.cache.block_size,
            "max_running_requests": config.scheduler.max_num_seqs,
            "max_prefill_tokens": config.scheduler.max_num_batched_tokens,
            "context_length": ready_info.get("max_model_len", config.scheduler.max_model_len),   # the engine's
            "speculative_num_draft_tokens": config.speculative.num_speculative_tokens, "version": version}


def model_info() -> dict:
    """SGLang's `/model_info` fields that sglang-router reads (paths null, as in `server_info`)."""
    return {"model_path": None, "tokenizer_path": None, "is_generation": True, "model_type": None,
            "architectures": None}
