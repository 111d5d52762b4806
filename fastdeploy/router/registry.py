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
    assigned: int = 0  # requests ever sent; among equally loaded instances the least used goes first

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

    def describe(self, now: float) -> dict:
        """The JSON row of ``GET /registered``."""
        return {**self.registration.model_dump(), "instance": self.key, "healthy": self.healthy,
                "outstanding": self.outstanding, "assigned": self.assigned,
                "consecutive_failures": self.consecutive_failures,
                "consecutive_successes": self.consecutive_successes,
                "seconds_since_heartbeat": round(now - self.last_heartbeat, 3)}


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
        if known.registration == registration:
            return "refreshed"
        known.registration = registration
        return "changed"

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

    def instances(self) -> list[Instance]:
        """Every registered instance, in registration order."""
        return sorted(self._instances.values(), key=lambda inst: inst.order)

    def describe(self) -> list[dict]:
        now = self._clock()
        return [inst.describe(now) for inst in self.instances()]

    def choose(self, role: str, model: str | None) -> Instance:
        """The healthy instance of ``role`` serving ``model`` (any model when None) with least outstanding."""
        return self._pick(self._healthy(role, model))

    def choose_pair(self, model: str | None) -> tuple[Instance, Instance]:
        """A healthy (prefill, decode) pair with equal config hashes, each the least loaded of its kind."""
        prefills = self._healthy("prefill", model)
        decodes = self._healthy("decode", model)
        shared = {p.registration.config_hash for p in prefills} & {d.registration.config_hash for d in decodes}
        if not shared:
            raise NoHealthyTargetError(
                "no healthy prefill/decode pair with equal config_hash (prefill: "
                f"{sorted({p.registration.config_hash for p in prefills})}, decode: "
                f"{sorted({d.registration.config_hash for d in decodes})})")
        decode = self._pick([d for d in decodes if d.registration.config_hash in shared])
        prefill = self._pick([p for p in prefills if p.registration.config_hash == decode.registration.config_hash])
        return prefill, decode

    @staticmethod
    def acquire(instance: Instance) -> None:
        """Counts a request sent to ``instance``."""
        instance.outstanding += 1
        instance.assigned += 1

    @staticmethod
    def release(instance: Instance) -> None:
        """Counts the end of a request sent to ``instance`` (also after it was dropped: the object survives)."""
        instance.outstanding -= 1

    def _healthy(self, role: str, model: str | None) -> list[Instance]:
        instances = self.instances()
        if model is not None and instances and all(inst.registration.model != model for inst in instances):
            # Unknown only when instances are registered and none serves it; an instance of the model that is
            # down, dropped or of the other role makes it unavailable (503), not unknown.
            served = sorted({inst.registration.model for inst in instances})
            raise UnknownModelError(f"model {model!r} is not served here (registered models: {served})")
        of_role = [inst for inst in instances if inst.role == role
                   and (model is None or inst.registration.model == model)]
        healthy = [inst for inst in of_role if inst.healthy]
        if not healthy:
            raise NoHealthyTargetError(f"no healthy {role} instance"
                                       + (f" serving model {model!r}" if model is not None else ""))
        return healthy

    def _pick(self, candidates: list[Instance]) -> Instance:
        if len(candidates) > EXACT_CHOICE_MAX_CANDIDATES:
            candidates = self._rng.sample(candidates, 2)
        return min(candidates, key=lambda inst: (inst.outstanding, inst.assigned, inst.order))
