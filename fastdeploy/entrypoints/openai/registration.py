"""Keeps an instance registered with its router: POST /register every --health-interval-secs (SERVICES §5).

The registration is also the heartbeat. Its fields are the router's contract (fastdeploy/router/protocol.py
`Registration`): role, host, port, connector address, model, configuration hash (PD_MTP_FLOW §3), slots, version,
and the engine's latest load (free slots and KV blocks, waiting requests), by which the router ranks D instances.
The connector address and the hash come from the engine core once it is ready (its Ready.info). With a
registration secret (`FD_ROUTER_SECRET`, else `FD_PD_SECRET`) every heartbeat is signed (fastdeploy/router/auth.py),
with a fresh timestamp and nonce each time.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import ipaddress
import json
import logging
import socket
from typing import Callable

import httpx

from fastdeploy.entrypoints.openai.advertise import advertised_host
from fastdeploy.entrypoints.openai.serve_args import model_aliases, served_model_names
from fastdeploy.router.auth import registration_secret, sign_headers

logger = logging.getLogger("fastdeploy.api_server")


def _ip_literal(host: str) -> str:
    """`host` as an IP literal (bracketed when IPv6): resolved here, once at start, so that no D resolves it."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = ipaddress.ip_address(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    return f"[{address}]" if address.version == 6 else str(address)


DISTRIBUTION = "fastdeploy-pd-mtp"      # pyproject.toml's project name


def package_version() -> str:
    """The installed distribution's version (GET /version, the registration), "0+source" when not installed."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "0+source"


def registration(args: argparse.Namespace, ready_info: dict) -> dict:
    """The JSON body of POST /register for this instance, under its served model name (what clients send as
    `model`, and what the router matches)."""
    host = advertised_host(args)
    connector = ready_info.get("connector_addr")
    if connector is not None:       # the connector binds --host; advertise it at an IP address of that host,
        connector = f"{_ip_literal(host)}:{connector.rpartition(':')[2]}"   # since D connects to IP literals only
    return {"role": args.splitwise_role, "host": host, "port": args.port, "connector_addr": connector,
            "model": served_model_names(args)[0], "model_aliases": list(model_aliases(args)),
            "config_hash": ready_info["config_hash"],
            "max_num_seqs": args.max_num_seqs, "version": package_version()}


def heartbeat_load(stats) -> dict | None:
    """The heartbeat's `load` (fastdeploy/router/protocol.py `Load`) from the engine core's latest EngineStats;
    None before the first one."""
    if stats is None:
        return None
    return {"free_slots": stats.free_slots, "total_slots": stats.total_slots, "free_kv_blocks": stats.free_kv_blocks,
            "total_kv_blocks": stats.total_kv_blocks, "num_waiting": stats.num_waiting}


async def keep_registered(router: str, body: dict, interval_s: float,
                          current_load: Callable[[], dict | None] = lambda: None) -> None:
    """POST `body`, with `current_load()` as its `load`, to the router now and every `interval_s` until
    cancelled; a refused or unreachable router is logged (once per change of state) and retried at the next
    interval. Each POST opens its own connection (one handshake per interval), so no heartbeat meets the close of
    an idle kept-alive connection."""
    url = f"http://{router}/register"
    secret = registration_secret()
    registered = None
    # A connection per heartbeat, none kept alive: the router (uvicorn) closes an idle connection after 5 s, the
    # default period, and a heartbeat sent on a pooled one as it closed failed on a healthy router (ReadError).
    no_pool = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=max(interval_s, 1.0), limits=no_pool) as http:
        while True:
            content = json.dumps({**body, "load": current_load()}, separators=(",", ":")).encode()
            headers = {"content-type": "application/json"}
            if secret is not None:
                headers.update(sign_headers(secret, content))
            try:
                response = await http.post(url, content=content, headers=headers)
                ok, why = response.status_code < 400, f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.HTTPError as error:
                ok, why = False, f"{type(error).__name__}: {error}"
            if ok and registered is not True:
                logger.info("registered: with router %s as %s %s:%d%s", router, body["role"], body["host"],
                            body["port"], "" if secret is not None else " (heartbeats not signed: no secret)")
            elif not ok and registered is not False:
                logger.warning("router %s refused or unreachable (%s); retrying every %g s", router, why, interval_s)
            elif ok:
                logger.debug("heartbeat: router %s", router)
            registered = ok
            await asyncio.sleep(interval_s)
