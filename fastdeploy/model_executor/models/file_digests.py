"""Remembers the BLAKE3 digest of whole files, so that a checkpoint's weights are read in full once per change.

A file's digest hashes every byte of it (memory-mapped, streamed by the blake3 package). It is kept under the file's
resolved path together with its size, mtime, ctime and inode, and reused while all four are unchanged: a rewrite
changes the ctime even where a tool restores size and mtime, and a copy or replacement is a new inode; a digest taken
within SETTLE_NS of the file's last change is not kept (a rewrite in that timestamp tick would not show). The cache
lives in this process's memory and in one JSON file per user (`$XDG_CACHE_HOME/fastdeploy/file_digests.json`, else
`~/.cache/fastdeploy/`), which an API server and its engine core share and a restart reuses; a cache file that
cannot be read or written is ignored (the digest is then computed again), never an error.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import blake3

MAX_ENTRIES = 4096   # the cache file holds the most recent ones: a few KiB per hundred checkpoint files
SETTLE_NS = 50_000_000   # well over a file-system timestamp tick (1-10 ms: the kernel's coarse clock)


def default_cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastdeploy" / "file_digests.json"


def _stamp(stat: os.stat_result) -> list[int]:
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def hash_file(file: Path) -> str:
    """BLAKE3 of every byte of `file` (hex, 32 bytes)."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if file.stat().st_size:   # an empty file cannot be memory-mapped
        hasher.update_mmap(file)
    return hasher.hexdigest()


class FileDigests:
    """`digest(file)`: the file's BLAKE3, computed only when no cache entry matches its current stamp.
    `hashed` counts the files this process actually read (tests check that a second call reads none)."""

    def __init__(self, cache_file: Path | None = None, clock: Callable[[], int] = time.time_ns):
        self.cache_file = cache_file
        self._clock = clock   # wall clock in ns, as file timestamps are
        self._entries: dict[str, list] = {}   # resolved path -> [size, mtime_ns, ctime_ns, inode, hex digest]
        self.hashed = 0

    def digest(self, file: Path) -> str:
        key = str(Path(file).resolve())
        stamp = _stamp(os.stat(key))
        entry = self._entries.get(key) or self._load().get(key)
        if isinstance(entry, list) and len(entry) == 5 and entry[:4] == stamp and isinstance(entry[4], str):
            self._entries[key] = entry
            return entry[4]
        started = self._clock()
        value = hash_file(Path(key))
        self.hashed += 1
        # Kept only when the stamp names this content for sure: the file was not rewritten while it was read, and
        # its last change is older than a timestamp tick before the read began (a rewrite within the same tick
        # would keep the stamp: git's "racily clean" case).
        if _stamp(os.stat(key)) == stamp and stamp[2] < started - SETTLE_NS:
            self._entries[key] = [*stamp, value]
            self._store(key)
        return value

    def _load(self) -> dict:
        if self.cache_file is None:
            return {}
        try:
            entries = json.loads(self.cache_file.read_text())
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}

    def _store(self, key: str) -> None:
        """Merge this entry into the cache file (written whole to a temporary file, then renamed over it, so a
        reader never sees half a file and concurrent writers lose at most each other's newest entry)."""
        if self.cache_file is None:
            return
        entries = self._load()
        entries.pop(key, None)
        entries[key] = self._entries[key]
        kept = dict(list(entries.items())[-MAX_ENTRIES:])
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=self.cache_file.parent, prefix=".file_digests-")
            with os.fdopen(fd, "w") as handle:
                json.dump(kept, handle)
            os.replace(temporary, self.cache_file)
        except OSError:
            pass


file_digests = FileDigests(default_cache_file())
