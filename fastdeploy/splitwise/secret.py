"""The optional shared secret of a PD deployment and the keyed tag of every connector message (SERVICES §7).

With a secret (`FD_PD_SECRET`, or the file named by `--pd-secret-file`) each message's tag is BLAKE3 keyed with a
key derived from it (derive-key mode, `MESSAGE_TAG_CONTEXT`; the hand-off tag has its own key from the same secret,
integrity.py), so a peer without the secret cannot have a message accepted; without one the tag is plain BLAKE3,
which catches accidents (a wrong peer, damaged frames) but authenticates nothing.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import blake3

from fastdeploy.splitwise.integrity import TAG_BYTES, derive_key, tags_equal

SECRET_ENV = "FD_PD_SECRET"
MESSAGE_TAG_CONTEXT = "fastdeploy-pd 2026-12-01 connector message tag v2"


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
        self._key = None if secret is None else derive_key(secret, MESSAGE_TAG_CONTEXT)

    @property
    def is_keyed(self) -> bool:
        return self._key is not None

    def tag(self, header: bytes, frames: Iterable[memoryview | bytes]) -> str:
        digest = blake3.blake3() if self._key is None else blake3.blake3(key=self._key)
        for part in (header, *frames):
            view = memoryview(part).cast("B")
            digest.update(view.nbytes.to_bytes(8, "little"))   # frame boundaries are tagged too
            digest.update(view)
        return digest.hexdigest(TAG_BYTES)

    def verify(self, tag: object, header: bytes, frames: Iterable[memoryview | bytes]) -> bool:
        return tags_equal(tag, self.tag(header, frames))
