"""Authenticates the registration heartbeat (``POST /register``) with a shared secret (docs/design.md "Router").

With a secret, an instance signs each heartbeat: ``X-FD-Timestamp`` (Unix seconds), ``X-FD-Nonce`` (random hex) and
``X-FD-Signature`` = hex HMAC-SHA256 over ``"fd-register-v1\\n" + timestamp + "\\n" + nonce + "\\n" + body`` keyed
with the secret. The router accepts a heartbeat only if the signature verifies, its timestamp is within
``MAX_AGE_S`` of the router's clock, and its nonce was not seen within that window: a captured registration can be
replayed neither later (stale) nor at once (nonce seen). The secret is ``FD_ROUTER_SECRET``, else the PD secret
``FD_PD_SECRET``, so one secret set for a PD deployment covers its router too; without either, registration is open
(a trusted network only), as in FastDeploy's router.

Instances import ``sign_headers`` to build their heartbeat, so both sides share one definition of the contract.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping

ROUTER_SECRET_ENV = "FD_ROUTER_SECRET"
PD_SECRET_ENV = "FD_PD_SECRET"
TIMESTAMP_HEADER = "x-fd-timestamp"
NONCE_HEADER = "x-fd-nonce"
SIGNATURE_HEADER = "x-fd-signature"
# Heartbeats come every health interval (5 s by default); the window also absorbs clock skew between machines.
MAX_AGE_S = 30.0
_DOMAIN = b"fd-register-v1"
_NONCE = re.compile(r"^[0-9a-f]{16,64}$")


class RegistrationAuthError(Exception):
    """The heartbeat is unsigned, forged, stale or replayed (HTTP 401); the message says which."""


def registration_secret(environ: Mapping[str, str] | None = None) -> bytes | None:
    """FD_ROUTER_SECRET, else FD_PD_SECRET (surrounding whitespace stripped), else None; ValueError naming the
    variable when it is set but empty."""
    environ = os.environ if environ is None else environ
    for name in (ROUTER_SECRET_ENV, PD_SECRET_ENV):
        value = environ.get(name)
        if value is not None:
            if not value.strip():
                raise ValueError(f"{name}: is set but empty")
            return value.strip().encode()
    return None


def signature(secret: bytes, timestamp: str, nonce: str, body: bytes) -> str:
    message = b"\n".join((_DOMAIN, timestamp.encode(), nonce.encode(), body))
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign_headers(secret: bytes, body: bytes, now: float | None = None) -> dict[str, str]:
    """The headers that authenticate ``body`` as one heartbeat."""
    timestamp = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(16)
    return {TIMESTAMP_HEADER: timestamp, NONCE_HEADER: nonce,
            SIGNATURE_HEADER: signature(secret, timestamp, nonce, body)}


class RegistrationVerifier:
    """Checks signed heartbeats; remembers the nonces of accepted ones for ``max_age_s`` (only signed heartbeats
    are remembered, so a sender without the secret cannot grow the set)."""

    def __init__(self, secret: bytes, clock: Callable[[], float] = time.time, max_age_s: float = MAX_AGE_S):
        self._secret = secret
        self._clock = clock
        self._max_age_s = max_age_s
        self._seen: dict[str, float] = {}   # nonce -> its heartbeat's timestamp

    def check_headers(self, headers: Mapping[str, str]) -> tuple[str, str, str]:
        """What can be checked before the body is read: the three headers are there, the timestamp is fresh and
        the nonce well-formed (RegistrationAuthError otherwise); returns (timestamp, nonce, signature)."""
        timestamp, nonce, given = (headers.get(h) for h in (TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER))
        if timestamp is None or nonce is None or given is None:
            raise RegistrationAuthError("registration is not signed: this router requires X-FD-Timestamp, "
                                        "X-FD-Nonce and X-FD-Signature (FD_ROUTER_SECRET or FD_PD_SECRET)")
        try:
            sent = float(timestamp)
        except ValueError:
            sent = math.nan
        if not math.isfinite(sent) or abs(self._clock() - sent) > self._max_age_s:
            raise RegistrationAuthError(f"registration timestamp {timestamp!r} is more than {self._max_age_s:g} s "
                                        "from the router's clock (stale or replayed)")
        if not _NONCE.match(nonce):
            raise RegistrationAuthError("registration nonce must be 16 to 64 lowercase hex digits")
        return timestamp, nonce, given

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        """Returns if the heartbeat is authentic and fresh; raises RegistrationAuthError otherwise."""
        timestamp, nonce, given = self.check_headers(headers)
        if not hmac.compare_digest(given.encode(), signature(self._secret, timestamp, nonce, body).encode()):
            raise RegistrationAuthError("registration signature does not verify (wrong secret or altered body)")
        now = self._clock()
        self._forget_older_than(now - self._max_age_s)
        if nonce in self._seen:
            raise RegistrationAuthError("registration nonce was already used (replayed)")
        self._seen[nonce] = float(timestamp)

    def _forget_older_than(self, limit: float) -> None:
        for nonce in [n for n, sent in self._seen.items() if sent < limit]:
            del self._seen[nonce]
