"""The optional shared secret of a PD deployment and the keyed tag of every connector message (SERVICES §7).

With a secret (`FD_PD_SECRET`, or the file named by `--pd-secret-file`) each message's tag is BLAKE2b keyed with it,
so a peer without the secret cannot have a message accepted; without one the tag is unkeyed BLAKE2b, which catches
accidents (a wrong peer, damaged frames) but authenticates nothing.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping

SECRET_ENV = "FD_PD_SECRET"
_TAG_BYTES = 16


def load_pd_secret(secret_file: str | None = None, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The secret from `secret_file` (surrounding whitespace stripped), else from FD_PD_SECRET, else None.
    ValueError naming the source when it is empty or unreadable."""
    if secret_file is not None:
        try:
            with open(secret_file, "rb") as handle:
                secret = handle.read().strip()
        except OSError as error:
            raise ValueError(f"--pd-secret-file: cannot read {secret_file!r}: {error.strerror}") from None
        if not secret:
            raise ValueError(f"--pd-secret-file: {secret_file!r} is empty")
        return secret
    value = (os.environ if environ is None else environ).get(SECRET_ENV)
    if value is None:
        return None
    if not value.strip():
        raise ValueError(f"{SECRET_ENV}: is set but empty")
    return value.strip().encode()


class MessageTagger:
    """Tags a message (its header bytes and body frames) and checks a received tag in constant time."""

    def __init__(self, secret: bytes | None):
        # BLAKE2b keys are at most 64 bytes: any secret is first reduced to a 32-byte key.
        self._key = b"" if secret is None else hashlib.blake2b(secret, digest_size=32, person=b"fd-pd-key").digest()

    @property
    def is_keyed(self) -> bool:
        return bool(self._key)

    def tag(self, header: bytes, frames: Iterable[memoryview | bytes]) -> str:
        digest = hashlib.blake2b(key=self._key, digest_size=_TAG_BYTES, person=b"fd-pd-zmq")
        for part in (header, *frames):
            digest.update(memoryview(part).nbytes.to_bytes(8, "little"))   # frame boundaries are tagged too
            digest.update(part)
        return digest.hexdigest()

    def verify(self, tag: object, header: bytes, frames: Iterable[memoryview | bytes]) -> bool:
        return isinstance(tag, str) and hmac.compare_digest(tag, self.tag(header, frames))
