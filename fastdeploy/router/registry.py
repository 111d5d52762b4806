"""Registry of serving instances: who registered, whether each is healthy, and which one gets the next request.

Pure bookkeeping with an injectable clock and random source: the HTTP polling lives in ``health.py`` and the
forwarding in ``forward.py``, so the rules of SERVICES §5 can be tested here without any process.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

from .protocol import Registration

# SERVICES §5: 3 consecutive failed health checks make an instance unhealthy, 2 successes restore it, and an
# instance whose heartbeat stops for 3 intervals is dropped.
FAILURES_TO_UNHEALTHY = 3
SUCCESSES_TO_HEALTHY = 2
MISSED_HEARTBEATS_TO_DROP = 3
# Up to this many candidates an exact least-outstanding scan is cheap and best; beyond it, power of two random
# choices avoids sending every new request to the same momentarily idle instance.
EXACT_CHOICE_MAX_CANDIDATES = 8


def _serves(instance: Instance, model: str) -> bool:
    """Whether a request naming `model` may go to `instance`: its served name or one of its aliases."""
    return model == instance.registration.model or model in instance.registration.model_aliases


class UnknownModelError(LookupError):
    """Instances are registered and none serves the requested model (HTTP 404)."""


class NoHealthyTargetError(LookupError):
    """No healthy instance, or no healthy compatible P/D pair, can take the request now (HTTP 503)."""


@dataclass(slots=True)
class Instance:
    """One registered instance and the router's view of it."""

    registration: Registration
    last_heartbeat: float  # clock time of the latest registration
    order: int  # registration order, the last tie-breaker
    # A fresh registration counts as healthy: the instance registers once it is ready, and a router that has
    # just restarted must serve as soon as instances re-register (SERVICES §6, router restart row).
    healthy: bool = True
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    outstanding: int = 0  # requests sent and not yet answered in full
    assigned: int = 0  # requests ever sent
    # P: prompt size of the requests sent and not yet answered, i.e. not yet handed off (see `prompt_size`)
    outstanding_prefill_work: int = 0
    last_chosen: float = float("-inf")  # clock time of the latest request sent: the least recently used first

    @property
    def key(self) -> str:
        return self.registration.key

    @property
    def role(self) -> str:
        return self.registration.role

    @property
    def url(self) -> str:
        host = self.registration.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.registration.port}"

    @property
    def free_slots(self) -> int:
        """Slots neither this router's outstanding requests nor (by the last heartbeat) anyone else's hold."""
        free = self.registration.max_num_seqs - self.outstanding
        load = self.registration.load
        return max(0, free if load is None else min(free, load.free_slots))

    @property
    def free_capacity(self) -> int:
        """Requests it can take now: its free slots, or fewer when (by the last heartbeat) its free KV blocks are
        less than that many slots' shares of the blocks (total blocks / total slots each)."""
        load = self.registration.load
        if load is None or load.total_kv_blocks == 0:
            return self.free_slots
        return min(self.free_slots, load.free_kv_blocks * load.total_slots // load.total_kv_blocks)

    def describe(self, now: float) -> dict:
        """The JSON row of ``GET /registered``."""
        return {**self.registration.model_dump(), "instance": self.key, "healthy": self.healthy,
                "outstanding": self.outstanding, "assigned": self.assigned,
                "outstanding_prefill_work": self.outstanding_prefill_work, "free_slots": self.free_slots,
                "free_capacity": self.free_capacity,
                "consecutive_failures": self.consecutive_failures,
                "consecutive_successes": self.consecutive_successes,
                "seconds_since_heartbeat": round(now - self.last_heartbeat, 3)}


def prompt_size(body: dict) -> int:
    """The prefill work a completion body asks for, as the router can see it without a tokenizer: the number of
    token ids of a token prompt, else the characters of the prompt text or of the chat messages' contents.
    Proportional to prompt tokens for one model, which is all that ranking instances of that model needs. Only
    the shapes the API accepts are looked into (a list of prompts, a message's list of content parts), so a body
    nested deeper costs no more to measure; the instance refuses it."""
    top = body.get("prompt", body.get("messages"))
    size = 0
    for item in top if isinstance(top, list) else [top]:
        if isinstance(item, dict):   # a chat message: its content, text or a list of parts
            item = item.get("content")
        for part in item if isinstance(item, list) else [item]:
            if isinstance(part, dict):
                part = part.get("text")
            if isinstance(part, str):
                size += len(part)
            elif isinstance(part, int) and not isinstance(part, bool):
                size += 1
            elif isinstance(part, list):    # one of several token prompts
                size += len(part)
    return size


class Registry:
    """Instances by key, with health hysteresis, heartbeat expiry and the choice of targets."""

    def __init__(self, heartbeat_interval: float, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None):
        if not heartbeat_interval > 0:
            raise ValueError(f"Registry: argument 'heartbeat_interval' must be > 0, got {heartbeat_interval!r}")
        self._interval = heartbeat_interval
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._instances: dict[str, Instance] = {}
        self._next_order = 0

    @property
    def drop_after_s(self) -> float:
        """How long an instance may stay silent before it is dropped: 3 heartbeat intervals."""
        return MISSED_HEARTBEATS_TO_DROP * self._interval

    def register(self, registration: Registration) -> str:
        """Records a heartbeat; returns "new", "changed" (same address, new description) or "refreshed".

        Health is not reset by a heartbeat: only health checks move it (a live process may still be unhealthy).
        """
        now = self._clock()
        known = self._instances.get(registration.key)
        if known is None:
            self._instances[registration.key] = Instance(registration, now, self._next_order)
            self._next_order += 1
            return "new"
        known.last_heartbeat = now
        same = known.registration.same_instance_as(registration)
        known.registration = registration   # the load of the latest heartbeat, at least
        return "refreshed" if same else "changed"

    def record_health(self, key: str, ok: bool) -> str | None:
        """Counts one health check; returns "unhealthy" or "healthy" when the state flips, else None."""
        instance = self._instances.get(key)
        if instance is None:  # dropped while its check was in flight
            return None
        if ok:
            instance.consecutive_failures = 0
            instance.consecutive_successes += 1
            if not instance.healthy and instance.consecutive_successes >= SUCCESSES_TO_HEALTHY:
                instance.healthy = True
                return "healthy"
            return None
        instance.consecutive_successes = 0
        instance.consecutive_failures += 1
        if instance.healthy and instance.consecutive_failures >= FAILURES_TO_UNHEALTHY:
            instance.healthy = False
            return "unhealthy"
        return None

    @staticmethod
    def mark_unreachable(instance: Instance) -> None:
        """The instance refused a connection: unhealthy at once, back after SUCCESSES_TO_HEALTHY checks."""
        instance.healthy = False
        instance.consecutive_successes = 0

    def drop_expired(self) -> list[Instance]:
        """Removes and returns the instances whose last heartbeat is more than 3 intervals old."""
        limit = self._clock() - self.drop_after_s
        expired = [inst for inst in self._instances.values() if inst.last_heartbeat < limit]
        for inst in expired:
            del self._instances[inst.key]
        return expired

    def is_serving(self, key: str) -> bool:
        """Whether the instance at `key` is registered and healthy (a dropped or unhealthy one is not)."""
        instance = self._instances.get(key)
        return instance is not None and instance.healthy

    def instances(self) -> list[Instance]:
        """Every registered instance, in registration order."""
        return sorted(self._instances.values(), key=lambda inst: inst.order)

    def describe(self) -> list[dict]:
        now = self._clock()
        return [inst.describe(now) for inst in self.instances()]

    def choose(self, role: str, model: str | None) -> Instance:
        """The healthy instance of ``role`` serving ``model`` (any model when None), with least outstanding
        requests, then least recently used."""
        return self._pick(self._healthy(role, model), _least_outstanding)

    def choose_pair(self, model: str | None) -> tuple[Instance, Instance]:
        """The (prefill, decode) pair for the next request: healthy (one that just refused a connection is not:
        `mark_unreachable`), with equal config hashes (PD_MTP_FLOW §3). D is the one with the most
        free decode capacity (a full D only when every D is full), P the one with the least outstanding prefill
        work; ties go to the least recently used (docs/design.md "Router")."""
        prefills = self._healthy("prefill", model)
        decodes = self._healthy("decode", model)
        shared = {p.registration.config_hash for p in prefills} & {d.registration.config_hash for d in decodes}
        if not shared:
            raise NoHealthyTargetError(
                "no healthy prefill/decode pair with equal config_hash (prefill: "
                f"{sorted({p.registration.config_hash for p in prefills})}, decode: "
                f"{sorted({d.registration.config_hash for d in decodes})})")
        decode = self._pick([d for d in decodes if d.registration.config_hash in shared], _most_free_capacity)
        prefill = self._pick([p for p in prefills if p.registration.config_hash == decode.registration.config_hash],
                             _least_prefill_work)
        return prefill, decode

    def acquire(self, instance: Instance, prefill_work: int = 0) -> None:
        """Counts a request sent to ``instance``; ``prefill_work``: its prompt size, for a prefill instance."""
        instance.outstanding += 1
        instance.assigned += 1
        instance.outstanding_prefill_work += prefill_work
        instance.last_chosen = self._clock()

    @staticmethod
    def release(instance: Instance, prefill_work: int = 0) -> None:
        """Counts the end of a request sent to ``instance`` (also after it was dropped: the object survives)."""
        instance.outstanding -= 1
        instance.outstanding_prefill_work -= prefill_work

    def _healthy(self, role: str, model: str | None) -> list[Instance]:
        instances = self.instances()
        if model is not None and instances and not any(_serves(inst, model) for inst in instances):
            # Unknown only when instances are registered and none serves it; an instance of the model that is
            # down, dropped or of the other role makes it unavailable (503), not unknown.
            served = sorted({inst.registration.model for inst in instances})
            raise UnknownModelError(f"model '{model}' is not served here (registered models: {', '.join(served)})")
        of_role = [inst for inst in instances if inst.role == role
                   and (model is None or _serves(inst, model))]
        healthy = [inst for inst in of_role if inst.healthy]
        if not healthy:
            raise NoHealthyTargetError(f"no healthy {role} instance"
                                       + (f" serving model {model!r}" if model is not None else ""))
        return healthy

    def _pick(self, candidates: list[Instance], rank: Callable[[Instance], tuple]) -> Instance:
        if len(candidates) > EXACT_CHOICE_MAX_CANDIDATES:
            candidates = self._rng.sample(candidates, 2)
        return min(candidates, key=rank)


def _least_outstanding(inst: Instance) -> tuple:
    return inst.outstanding, inst.last_chosen, inst.order


def _least_prefill_work(inst: Instance) -> tuple:
    return inst.outstanding_prefill_work, inst.outstanding, inst.last_chosen, inst.order


def _most_free_capacity(inst: Instance) -> tuple:
    return -inst.free_capacity, inst.last_chosen, inst.order
