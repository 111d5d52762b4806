"""Decides the address an instance gives other processes (its router, its PD peers) for reaching it (SERVICES §5).

What an instance advertises is what its router forwards to and what the peer's connector and Mooncake's transfer
engine dial, so it must be an address of this host that those processes can reach:

1. `--advertise-host` when given (vLLM's `VLLM_HOST_IP`, SGLang's `--host`; FastDeploy has no such flag and
   registers `gethostbyname(gethostname())`, 127.0.1.1 on a stock Debian host);
2. else `--host` when it is one address (the instance listens there and nowhere else);
3. else, bound to every interface (`--host 0.0.0.0`, the default) with `--router HOST:PORT`: the address of the
   interface this host would use to reach the router (a UDP socket `connect`ed to the router's address: the kernel
   picks the route and source address; no packet is sent);
4. else this host name's address, as before (no router to aim at; 127.0.0.1 when the name does not resolve).

A loopback address reaches only this host, so advertising one to a router on another host is refused at start
(`advertise_problem`), as is advertising a wildcard address, which reaches nothing.
"""
from __future__ import annotations

import argparse
import ipaddress
import socket

WILDCARD_HOSTS = ("", "0.0.0.0", "::")


def _addresses(host: str) -> list[str]:
    """`host`'s IP addresses (itself when it is one); [] when it does not resolve."""
    try:
        return [ipaddress.ip_address(host).compressed]
    except ValueError:
        pass
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)})
    except OSError:
        return []


def is_loopback(host: str) -> bool:
    """True when `host` (an address, or a name resolving only to such) is a loopback address."""
    addresses = _addresses(host)
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def route_source(host: str, port: int) -> str | None:
    """The local address this host would send from to reach `host:port`, or None when there is no route."""
    addresses = _addresses(host)
    if not addresses:
        return None
    family = socket.AF_INET6 if ":" in addresses[0] else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((addresses[0], port))       # UDP: chooses the route, sends nothing
            return probe.getsockname()[0]
    except OSError:
        return None


def _router_address(args: argparse.Namespace) -> tuple[str, int] | None:
    if not getattr(args, "router", None):
        return None
    host, _, port = args.router.rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def advertised_host(args: argparse.Namespace) -> str:
    """The address this instance gives its router and peers (the module docstring's rules, in order)."""
    if getattr(args, "advertise_host", None):
        return args.advertise_host
    if args.host not in WILDCARD_HOSTS:
        return args.host
    router = _router_address(args)
    if router is not None:
        source = route_source(*router)
        if source is not None:
            return source
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:     # a host name that does not resolve: this host is all that can be said
        return "127.0.0.1"


def advertise_problem(args: argparse.Namespace, advertised: str) -> str | None:
    """Why advertising `advertised` cannot work, as one line, or None."""
    flag = "--advertise-host" if getattr(args, "advertise_host", None) else "the advertised address"
    if advertised in WILDCARD_HOSTS:
        return (f"{flag} {advertised!r} is a wildcard address, which no other process can reach; give this host's "
                f"address")
    router = _router_address(args)
    if router is not None and is_loopback(advertised) and not is_loopback(router[0]):
        return (f"--router {args.router} is on another host, yet this instance would advertise loopback address "
                f"{advertised} to it (--host {args.host}), which reaches only this host; listen on a reachable address "
                f"(--host 0.0.0.0 or this host's address) or give --advertise-host")
    return None


def advertise_warning(args: argparse.Namespace, advertised: str) -> str | None:
    """A warning for an instance bound to every interface that still advertises loopback (no router to aim at,
    no --advertise-host, and a host name resolving to loopback): fine on one host, unreachable from any other
    (behind sglang-router, D's Mooncake segment is what P on another host would fail to reach)."""
    if getattr(args, "advertise_host", None) or args.host not in WILDCARD_HOSTS or not is_loopback(advertised):
        return None
    return (f"this instance listens on every interface (--host {args.host}) but advertises {advertised} (this host "
            f"name's address) as its connector and transfer address, which peers on other hosts cannot reach; give "
            f"--advertise-host (or --router, whose route picks the address) when P and D are on different hosts")
