"""The rules for a PD request's pairing fields, one place for the HTTP body and the engine (docs/design.md §8,
"Connector addresses"): the request id P and D share, and a connector address `host:port` that a client, a router
or sglang-router hands to D.

D connects a ZeroMQ DEALER to `tcp://<address>`; libzmq refuses some strings in `connect` (`-:5000`, `_x:5000`,
`.a.:5000`: its syntax check wants a letter, digit, `[` or `:` first) and accepts others it can never reach
(`a:0`, `a:99999`). The rule here is a strict subset of what libzmq accepts, so an address that passes never makes
`connect` raise: a DNS name (dot-separated labels of letters, digits, `-` and `_`, each starting and ending with a
letter or digit, at most 253 characters), an IPv4 address, or an IPv6 address in brackets (`[::1]`, with a zone
id of the characters libzmq's check allows in it, `[A-Za-z0-9._-]`: `[fe80::1%eth0]`); then `:` and a decimal
port 1..65535 without sign or leading zero. Python's `ipaddress` takes any zone id without `%` or `/`, libzmq's
`connect` refuses a space or `$` in one (EINVAL), so the zone id has its own rule.
"""
from __future__ import annotations

import ipaddress
import re

MAX_ADDRESS_LENGTH = 300
MAX_REQUEST_ID_LENGTH = 200
REQUEST_ID_PATTERN = r"^[A-Za-z0-9._:\-]+$"
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9_\-]*[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
_PORT = re.compile(r"^[1-9][0-9]{0,4}$")
_ZONE_ID = re.compile(r"^[A-Za-z0-9._\-]+$")


def host_error(host: object) -> str | None:
    """Why `host` cannot be the host part of a connector address; None when it can."""
    if not isinstance(host, str) or not host:
        return "the host must be a non-empty string"
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host!r} is not an IPv6 address in brackets"
        _, percent, zone = host[1:-1].partition("%")
        if percent and not _ZONE_ID.match(zone):
            return f"{host!r} has a zone id other than letters, digits and '._-'"
        return None
    if len(host) > 253 or not _HOSTNAME.match(host):
        return f"{host!r} is not a host name, an IPv4 address or a bracketed IPv6 address"
    if all(label.isdigit() for label in host.split(".")):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"{host!r} is not an IPv4 address"
    return None


def port_error(port: object) -> str | None:
    """Why `port` (an int, or its decimal text) cannot be a connector port; None when it can."""
    if isinstance(port, bool) or not isinstance(port, (int, str)):
        return "the port must be an integer"
    text = str(port)
    if not _PORT.match(text) or int(text) > 65535:
        return f"the port must be an integer in 1..65535 (got {port!r})"
    return None


def address_error(value: object) -> str | None:
    """Why `value` is not a connector address `host:port`; None when it is."""
    if not isinstance(value, str):
        return f"must be a 'host:port' string (got {type(value).__name__})"
    if len(value) > MAX_ADDRESS_LENGTH:
        return f"must be at most {MAX_ADDRESS_LENGTH} characters (got {len(value)})"
    host, sep, port = value.rpartition(":")
    if not sep:
        return f"must be 'host:port' (got {value!r})"
    why = host_error(host) or port_error(port)
    return None if why is None else f"must be 'host:port': {why}"


def peer_address_error(value: object) -> str | None:
    """Why `value` cannot be the address of a P that D connects to (`prefill_addr`, `bootstrap_host`); None when it
    can. An IP literal only: libzmq resolves a host name with a blocking getaddrinfo on the context's one I/O
    thread, so one slow name would stall every reservation, acknowledgement and hand-off of D (libzmq #3243)."""
    why = address_error(value)
    if why is not None:
        return why
    host = value.rpartition(":")[0]
    if not host.startswith("[") and not all(label.isdigit() for label in host.split(".")):
        return (f"must be 'ip:port' (got host name {host!r}): D connects to IP addresses only, since libzmq would "
                "resolve a name on the connector's only I/O thread")
    return None


def check_address(field: str, value: object) -> str:
    """`value` if it is a connector address; ValueError naming `field` otherwise."""
    why = address_error(value)
    if why is not None:
        raise ValueError(f"field '{field}' {why}")
    return value


def request_id_error(value: object) -> str | None:
    """Why `value` cannot be the request id of a PD pairing; None when it can."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_REQUEST_ID_LENGTH:
        return f"must be a string of 1..{MAX_REQUEST_ID_LENGTH} characters (got {value!r:.80})"
    if not _REQUEST_ID.match(value):
        return f"must hold only letters, digits and '._:-' (got {value!r:.80})"
    return None
