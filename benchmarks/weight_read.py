"""The reference of a memory-bound product or decode step: a function that reads given arrays' bytes once.

The bytes are copied once into one buffer marked for transparent huge pages before it is written, as the engine's
packed weights are (custom_ops/cpu_ops/cpu_linear.cc, OPS §10.1), and summed as uint64 words on `threads` threads,
one contiguous part each (NumPy's sum releases the GIL), as many as the product or step it is compared with runs on.
Measured on the AMD EPYC Zen 4, 1 GiB: 28 GiB/s on one thread, 55 on two (in 4 KiB pages 26 and 46-49); on the
Intel Xeon that replaced it, ~14 and ~27 GiB/s; docs/benchmarks.md "Huge pages", "A new machine".
"""
from __future__ import annotations

import mmap
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def weight_reader(arrays: list[np.ndarray], threads: int):
    """A function reading every byte of `arrays` once (the last < 8 bytes of each aside) on `threads` threads."""
    total = sum(a.nbytes // 8 for a in arrays)
    buffer = mmap.mmap(-1, max(8, total * 8))
    buffer.madvise(mmap.MADV_HUGEPAGE)
    words = np.frombuffer(buffer, np.uint64)[:total]
    at = 0
    for a in arrays:
        n = a.nbytes // 8
        words[at:at + n] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)[:n * 8].view(np.uint64)
        at += n
    parts = np.array_split(words, threads)
    pool = ThreadPoolExecutor(threads)
    return lambda: list(pool.map(np.sum, parts))
