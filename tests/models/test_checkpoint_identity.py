"""A checkpoint's identity hashes every byte of its weights (checkpoint.py `_content_digest`, docs/design.md
"Checkpoints: sizing and identity"): two checkpoints that differ in one tensor anywhere get different identities,
KV identities and PD configuration hashes (so P and D on them are not paired, SERVICES §6); a file's digest is
computed once per change of it, and a restart reads it from the cache file instead of hashing again."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from fastdeploy.config import FDConfig
from fastdeploy.engine.connector.base import instance_config_hash
from fastdeploy.model_executor.models.checkpoint import read_checkpoint_config
from fastdeploy.model_executor.models.file_digests import SETTLE_NS, FileDigests
from tests.checkpoint_files import halve_a_tensor_between_samples, write_numpy_checkpoint


def test_checkpoints_that_differ_in_one_tensor_mid_file_have_different_identities(tmp_path):
    """One tensor halved in place, in the first half of a file over 1 MiB and outside every 64 KiB sample (every
    other byte, the size and config.json unchanged): the identity, the KV identity and the PD configuration hash
    all differ from the original's; a byte-identical copy at another path keeps all three."""
    original = write_numpy_checkpoint(tmp_path / "original", num_hidden_layers=10)
    weights = original / "model.safetensors"
    assert weights.stat().st_size > 1 << 20
    copy = Path(shutil.copytree(original, tmp_path / "copy"))
    edited = Path(shutil.copytree(original, tmp_path / "edited"))
    halve_a_tensor_between_samples(edited / "model.safetensors")
    assert (edited / "model.safetensors").stat().st_size == weights.stat().st_size

    def names(directory: Path) -> tuple:
        config = FDConfig(model=str(directory))
        return (read_checkpoint_config(directory).identity, config.kv_identity,
                instance_config_hash(config, vocab_size=384))

    ours = names(original)
    assert names(copy) == ours
    theirs = names(edited)
    assert all(a != b for a, b in zip(ours, theirs)), (ours, theirs)


def test_a_file_is_hashed_once_per_change_and_a_restart_reads_the_cache(tmp_path):
    """FileDigests with a cache file: the first digest reads the file, a second call and a fresh instance on the
    same cache file (a restart) read nothing; a rewrite that keeps the size and restores the mtime is hashed
    again and gives the new content's digest."""
    file, cache = tmp_path / "w.bin", tmp_path / "cache" / "digests.json"
    file.write_bytes(bytes(range(256)) * 8192)
    time.sleep(2 * SETTLE_NS / 1e9)   # a file changed within a timestamp tick of its hash is not cached (racy)
    first = FileDigests(cache)
    digest = first.digest(file)
    assert first.hashed == 1 and first.digest(file) == digest and first.hashed == 1
    restarted = FileDigests(cache)
    assert restarted.digest(file) == digest and restarted.hashed == 0
    stat = file.stat()
    with open(file, "r+b") as handle:
        handle.seek(stat.st_size // 2)
        handle.write(b"\xff")
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert file.stat().st_size == stat.st_size and file.stat().st_mtime_ns == stat.st_mtime_ns
    again = FileDigests(cache)
    assert again.digest(file) != digest and again.hashed == 1


def test_a_file_hashed_within_a_timestamp_tick_of_its_change_is_not_cached(tmp_path):
    """Git's racily-clean case: a rewrite in the same file-system timestamp tick as the hash would keep the stamp,
    so a digest taken that soon after the file's change is kept neither in memory nor in the cache file (the
    clock is pinned to the file's ctime: the hash in the very tick of the change)."""
    file, cache = tmp_path / "w.bin", tmp_path / "digests.json"
    file.write_bytes(b"w" * 4096)
    digests = FileDigests(cache, clock=lambda: file.stat().st_ctime_ns)
    digests.digest(file)
    digests.digest(file)
    assert digests.hashed == 2 and not cache.exists()
