"""Schema of the registration heartbeat that instances POST to the router's ``/register`` (SERVICES §5).

Instances import this model to build their heartbeat, so both sides validate the same contract.
"""
from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

ROLES = ("mixed", "prefill", "decode")


def parse_host_port(value: str) -> tuple[str, int]:
    """Splits ``"host:port"``; raises ValueError unless the host is non-empty and the port is 1..65535."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"must be 'host:port' with a port in 1..65535, got {value!r}")
    return host, int(port)


class Load(BaseModel):
    """An instance's load as its engine last reported it, carried by each heartbeat (the router ranks D by it).

    Optional in a registration: an instance that sends none is ranked by the router's own counts alone.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    free_slots: int = Field(ge=0)
    total_slots: int = Field(ge=0)
    free_kv_blocks: int = Field(ge=0)
    total_kv_blocks: int = Field(ge=0)
    num_waiting: int = Field(ge=0)


class Registration(BaseModel):
    """One instance's self-description, sent at start and then every health interval as its heartbeat.

    Strict and closed: a field of the wrong JSON type or an unknown field is refused (400 naming it), so that a
    sender that drifts from the contract fails loudly at its first heartbeat instead of being half understood.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    role: Literal["mixed", "prefill", "decode"]
    # A host name or IP address (IPv6 without brackets); nothing that would break the instance's URL.
    host: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._:-]+$")
    port: int = Field(ge=1, le=65535)
    # Required but nullable: a mixed instance has no connector; P and D must name theirs (checked below).
    connector_addr: str | None
    model: str = Field(min_length=1, max_length=255)
    # Other strings a client may send as `model` for it (the --model path as given, as the instance itself
    # accepts); optional, so that an instance that sends none registers as before.
    model_aliases: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(default=[], max_length=8)
    # PD_MTP_FLOW §3: P and D are paired only when these are equal.
    config_hash: str = Field(min_length=1, max_length=255)
    max_num_seqs: int = Field(ge=1)
    version: str = Field(min_length=1, max_length=64)
    load: Load | None = None

    def same_instance_as(self, other: "Registration") -> bool:
        """Equal descriptions, whatever the load: a heartbeat whose load alone moved is a refresh."""
        return self.model_dump(exclude={"load"}) == other.model_dump(exclude={"load"})

    @field_validator("connector_addr")
    @classmethod
    def _connector_addr_matches_role(cls, value: str | None, info: ValidationInfo) -> str | None:
        role = info.data.get("role")
        if value is None:
            if role in ("prefill", "decode"):
                raise ValueError(f"a {role} instance must give its connector address 'host:port'")
            return None
        parse_host_port(value)
        return value

    @property
    def key(self) -> str:
        """The instance's identity in the registry: its HTTP address."""
        return f"{self.host}:{self.port}"


def _unreachable(host: str) -> bool:
    """A loopback or wildcard address: it reaches no other host (a name is left to the instance to resolve)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def unreachable_field(registration: Registration, sender: str | None) -> str | None:
    """The field ("host" or "connector_addr") of a registration sent from another host (`sender`, the HTTP
    client's address) that names a loopback or wildcard address, which the router and the peers cannot reach;
    None when every address can be reached, or the sender is on this host."""
    if sender is None or _unreachable(sender):
        return None
    if _unreachable(registration.host):
        return "host"
    if registration.connector_addr is not None and _unreachable(parse_host_port(registration.connector_addr)[0]):
        return "connector_addr"
    return None
