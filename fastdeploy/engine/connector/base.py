"""The KV connector interface: how one LLMEngine takes part in PD disaggregation, and the mixed role's connector.

An instance is one LLMEngine; its role only chooses the connector plugged into it (docs/design.md §6):
mixed -> `MixedConnector`, prefill -> `PrefillConnector`, decode -> `DecodeConnector`. The connector has two halves.

Scheduler half (this interface), called by the engine and its scheduler at fixed points:

- `admit(request, disaggregate_info)` from `LLMEngine.add_request`, before anything is allocated: may this role
  serve the request (ValueError naming why, if not); it marks the request (`remote_decode` on P, `remote_prefill`
  on D) and says where it starts (waiting, or waiting for the peer).
- `poll(wait_s)` before every `schedule()`: reservations, acknowledgements and received hand-offs from the peer,
  expired waits. It moves requests on through the scheduler's verbs (`release_to_waiting`, `on_prefilled`,
  `finish`), never by touching its queues.
- `on_allocated(request)` from the scheduler once a `remote_prefill` request holds its slot and blocks: tell P.
- `request_finished(request)` from `Scheduler.finish`, for every request that ends: True asks the resource manager
  to keep the request's blocks under its id ("delay free": a transfer still reads or writes them).
- `finished_transfers()` after every `poll`: the ids whose kept blocks may go back to the pool now (the transfer
  finished, or can no longer touch them). The connector never holds block ids itself (docs/design.md §8).

Worker half: the `KVPort` next to the model runner (fastdeploy/worker/kv_transfer.py) reads a request's prompt KV
for sending and writes received KV into its blocks.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from fastdeploy.config import FDConfig
from fastdeploy.schema.pairing import address_error, peer_address_error, request_id_error
from fastdeploy.schema.request import Request, RequestStatus
from fastdeploy.splitwise import (Clock, Deadline, HandoffDeadlines, HandoffTransport, KVLayout, MonotonicClock,
                                  PendingWaits, config_hash)
from fastdeploy.splitwise.handoff import PlacedKV
from fastdeploy.splitwise.mooncake import Destination

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fastdeploy.engine.resource_manager import ResourceManager
    from fastdeploy.engine.scheduler import Scheduler

# How long an idle PD instance waits for a message from its peer in one step (real time, or virtual in tests).
IDLE_POLL_S = 0.01

# The message a PD instance refuses a request with that did not come through a router (SERVICES §6).
SEND_TO_ROUTER = "send requests to the router"


class KVPort(Protocol):
    """The worker half: one instance's KV cache as the hand-off sees it (fastdeploy/worker/kv_transfer.py)."""

    layout: KVLayout

    def read_prompt_kv(self, block_ids: Sequence[int],
                       num_tokens: int) -> tuple[list[np.ndarray], list[np.ndarray]]: ...

    def write_prompt_kv(self, block_ids: Sequence[int], kv_target: Sequence[np.ndarray],
                        kv_mtp: Sequence[np.ndarray]) -> None: ...

    def placed_kv(self, num_tokens: int) -> PlacedKV: ...

    @property
    def in_host_memory(self) -> bool: ...

    def prompt_kv_chunks(self, block_ids: Sequence[int], num_tokens: int) -> list[memoryview]: ...


class OneSidedTransfer(Protocol):
    """A transfer engine through which P writes a prompt's KV straight into D's blocks (splitwise/mooncake.py
    `MooncakeKVTransfer`); only the hand-off's header then crosses the connector (docs/design.md §8)."""

    def reservation_data(self, block_ids: Sequence[int]) -> dict: ...

    def in_place(self, block_ids: Sequence[int]) -> Callable[[int], Iterable]: ...

    def write_to(self, destination: Destination, block_ids: Sequence[int], num_tokens: int,
                 timeout_s: float, on_copied: Callable[[], None] | None = None) -> Iterator: ...

    def staged_writes(self) -> int: ...

    def close(self) -> None: ...


def instance_config_hash(config: FDConfig, vocab_size: int, tokenizer: str = "", chat_template: str = "") -> str:
    """The PD_MTP_FLOW §3 compatibility hash of one instance: P's and D's must be equal. `tokenizer` and
    `chat_template` name what turns a request body into prompt ids (the builder knows them, the engine does not)."""
    k = config.num_speculative_tokens
    # model_identity: the embedded model's name, or a checkpoint's content digest (not its path, which P and D
    # on two hosts need not share); MTP weights of their own directory by theirs
    mtp = (config.mtp_identity or f"{config.model_identity}/mtp") if k else None
    return config_hash(model_name=config.model_identity, vocab_size=vocab_size, num_speculative_tokens=k,
                       mtp_model=mtp, block_size=config.cache.block_size,
                       kv_dtype=f"{config.kv_dtype}|weights={config.precision_identity}",
                       transport=config.cache.transfer_protocol,
                       max_model_len=config.scheduler.max_model_len, tokenizer=tokenizer,
                       chat_template=chat_template)


def _check_address(field: str, value: object) -> str | None:
    rule = peer_address_error if field == "prefill_addr" else address_error
    why = None if value is None else rule(value)
    if why is not None:
        raise ValueError(f"disaggregate_info: field '{field}' {why}")
    return value


@dataclass(slots=True, frozen=True)
class DisaggregateInfo:
    """Where a PD request's other half runs (SERVICES §6): the router puts it in both HTTP bodies."""

    request_id: str
    prefill_addr: str | None = None     # P's connector (D sends its reservation and acks there)
    decode_addr: str | None = None      # D's connector (informational: D connects to P, docs/design.md §8)

    @classmethod
    def parse(cls, value: object, request_id: str) -> DisaggregateInfo:
        """Validate the opaque dict from the HTTP body; ValueError naming the field."""
        if not isinstance(value, dict):
            raise ValueError(f"disaggregate_info: must be an object (got {type(value).__name__})")
        unknown = set(value) - {"request_id", "prefill_addr", "decode_addr"}
        if unknown:
            raise ValueError(f"disaggregate_info: unknown field(s) {sorted(unknown)}")
        rid = value.get("request_id", request_id)
        why = request_id_error(rid)
        if why is not None:
            raise ValueError(f"disaggregate_info: field 'request_id' {why}")
        if rid != request_id:
            raise ValueError(f"disaggregate_info: field 'request_id' is {rid!r}, the request's id is "
                             f"{request_id!r}")
        return cls(request_id, _check_address("prefill_addr", value.get("prefill_addr")),
                   _check_address("decode_addr", value.get("decode_addr")))


class KVConnector:
    """The scheduler half. Every hook but `admit` defaults to doing nothing (what a mixed instance needs)."""

    role: str

    def bind(self, scheduler: Scheduler, resources: ResourceManager, config_hash: str) -> None:
        """Called once by the engine: the scheduler whose verbs `poll` uses, the pool blocks are taken from, and
        the instance's PD_MTP_FLOW §3 hash (hand-offs are sealed and checked with it)."""
        self.scheduler, self.resources, self.config_hash = scheduler, resources, config_hash

    def admit(self, request: Request, disaggregate_info: dict | None) -> RequestStatus:
        """Role rules, before anything is allocated; ValueError naming why this role cannot serve `request`.
        Returns the status the request starts in (WAITING, or WAITING_FOR_PEER)."""
        raise NotImplementedError

    def poll(self, wait_s: float) -> None:
        """Before scheduling: take in what the peer sent, waiting up to `wait_s` for the first message."""

    def on_allocated(self, request: Request) -> bool:
        """A `remote_prefill` request now holds its slot and blocks; False if the peer cannot be told yet (its
        queue is full: the scheduler then gives them back and retries later). A request the peer can never be
        told about is failed by the connector, never raised here."""
        raise NotImplementedError(f"{type(self).__name__} serves no remote_prefill request")

    def peer_key(self, request: Request) -> object:
        """Which peer `request` is reserved at (requests of one peer are admitted in order, and a peer whose
        queue is full delays no other peer's); None when the instance has one peer or none."""
        return None

    def peer_ready(self, request: Request) -> bool:
        """Whether `request`'s peer can be told of a reservation now (D: its P completed a connection); while it
        cannot, the scheduler gives the request no slot and admits other peers' requests."""
        return True

    def request_finished(self, request: Request) -> bool:
        """`request` ended (its status and finish reason are set). True: keep its blocks held under its id until
        `finished_transfers` names it; False: free them with its slot now.

        A connector that cannot take the request over may turn the finish into an abort
        (finish reason and error set on `request`) so the client learns the cause.
        """
        return False

    def finished_transfers(self) -> list[str]:
        """Ids of finished requests whose held blocks may be freed now, each reported once (the resource manager
        frees nothing twice)."""
        return []

    def has_unfinished(self) -> bool:
        """Work the connector still has (transfers whose blocks are kept, unsent messages, pending waits): the
        engine keeps stepping, each idle step waiting at most its idle poll for the peer."""
        return False

    def has_peer_waits(self) -> bool:
        """Some request waits on the peer (progress then comes from a message or a deadline)."""
        return False

    def describe(self) -> dict:
        """Fields the router registers this instance under, beyond role and config hash (SERVICES §5)."""
        return {}

    def describe_held(self) -> str:
        """What the connector holds, for a stall report (engine/watchdog.py)."""
        return ""

    def counters(self) -> dict | None:
        """The SERVICES §4 PD metrics; None for a mixed instance."""
        return None

    def close(self) -> None:
        """Release what is held outside the process (a transport's sockets)."""


class MixedConnector(KVConnector):
    """A mixed instance computes and decodes every request itself: it refuses PD requests at admission."""

    role = "mixed"

    def admit(self, request: Request, disaggregate_info: dict | None) -> RequestStatus:
        if disaggregate_info is not None:
            raise ValueError("'disaggregate_info' is only for prefill and decode instances (this instance is "
                             "mixed: send the request without it)")
        return RequestStatus.WAITING


class PDConnector(KVConnector):
    """What the prefill and decode connectors share: the transport to the peer, the worker half, the
    compatibility hash, the deadlines of every wait on the peer (PD_MTP_FLOW §12.3), and the one-sided transfer
    engine when the KV does not travel in the connector's messages (None: it does)."""

    peer_role: str

    def __init__(self, transport: HandoffTransport, kv: KVPort, clock: Clock | None = None,
                 deadlines: HandoffDeadlines | None = None, kv_transfer: OneSidedTransfer | None = None):
        self.transport, self.kv, self.kv_transfer = transport, kv, kv_transfer
        self.clock = clock if clock is not None else MonotonicClock()
        self.deadlines = deadlines if deadlines is not None else HandoffDeadlines()
        self.waits = PendingWaits(self.clock, self.deadlines)
        self.num_transport_errors = 0   # transport calls that raised (each failed its request, never the step)

    def count_transport_error(self, what: str, rid: str, error: Exception) -> None:
        """A transport call raised: the request it was for fails (the caller does that), the instance goes on;
        counted (the `pd_transport_errors_total` metric, SERVICES §4)."""
        self.num_transport_errors += 1
        logger.error("PD %s: %s of request %s failed in the transport: %s", self.role, what, rid, error)

    def safe_refuse(self, rid: str, reason: str) -> None:
        """`transport.refuse` (P will not write this hand-off: D is told) that cannot raise out of the step."""
        try:
            self.transport.refuse(rid, reason)
        except Exception as error:   # noqa: BLE001 - nothing the transport raises leaves the engine step
            self.count_transport_error("refuse", rid, error)

    def safe_forget(self, rid: str) -> None:
        """`transport.forget` that cannot raise out of the engine step (a post; only a bug would raise)."""
        try:
            self.transport.forget(rid)
        except Exception as error:   # noqa: BLE001 - nothing the transport raises leaves the engine step
            self.count_transport_error("forget", rid, error)

    def parse_info(self, request: Request, disaggregate_info: dict | None) -> DisaggregateInfo:
        """A PD instance serves only requests a router paired with an instance of the other role."""
        if disaggregate_info is None:
            raise ValueError(f"{SEND_TO_ROUTER}: a {self.role} instance serves only requests that a router pairs "
                             f"with a {self.peer_role} instance ('disaggregate_info' is missing)")
        return DisaggregateInfo.parse(disaggregate_info, request.request_id)

    def handoff_kv_bytes(self, num_tokens: int) -> int:
        """The KV bytes a hand-off of `num_tokens` prompt positions moves (every target and MTP layer): what its
        transfer deadlines scale by, computed alike on P and D (splitwise/deadline.py)."""
        specs = self.kv.placed_kv(num_tokens)
        return sum(spec.nbytes for spec in specs.target + specs.mtp)

    def deadline(self, wait_s: float) -> Deadline | None:
        return Deadline.after(self.clock, wait_s) if wait_s > 0 else None

    def has_peer_waits(self) -> bool:
        return len(self.waits) > 0

    def describe(self) -> dict:
        return {"connector_addr": self.transport.address}

    def close(self) -> None:
        self.transport.close()
        if self.kv_transfer is not None:
            self.kv_transfer.close()
