"""Metadata validation shared by the reference ops (OPS §2.2, §2.3), raising the op's `ValueError`."""

import numpy as np

INT32 = np.dtype(np.int32)
INT64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)


class ArgChecker:
    """Checks one op's arguments; every failure names the op and the argument: "<op>: argument '<arg>': ..."."""

    def __init__(self, op: str):
        self.op = op

    def fail(self, arg: str, what: str):
        raise ValueError(f"{self.op}: argument '{arg}': {what}")

    def array(self, arg: str, a, dtype: np.dtype) -> None:
        """A C-contiguous NumPy array of exactly `dtype` (no implicit casting, OPS §2.2)."""
        if not isinstance(a, np.ndarray):
            self.fail(arg, f"expected a NumPy array (got {type(a).__name__})")
        if a.dtype != dtype:
            self.fail(arg, f"expected dtype {dtype} (got {a.dtype})")
        if not a.flags.c_contiguous:
            self.fail(arg, "must be contiguous")

    def per_slot(self, arg: str, a, dtype: np.dtype, n: int) -> None:
        """A per-slot vector: shape [n] or [n, 1] (OPS §1)."""
        self.array(arg, a, dtype)
        if a.shape not in ((n,), (n, 1)):
            self.fail(arg, f"expected shape [{n}] or [{n}, 1] (got {list(a.shape)})")

    def vector_len(self, arg: str, a, dtype: np.dtype) -> int:
        """A vector whose length is derived from it: shape [N] or [N, 1]; returns N."""
        self.array(arg, a, dtype)
        if a.ndim == 1 or (a.ndim == 2 and a.shape[1] == 1):
            return a.shape[0]
        self.fail(arg, f"expected shape [N] or [N, 1] (got {list(a.shape)})")

    def matrix(self, arg: str, a, dtype: np.dtype, rows: int, cols: int | None = None) -> int:
        """A 2-D [rows, cols] array with cols >= 1 (cols taken from `a` when None); returns cols."""
        self.array(arg, a, dtype)
        if a.ndim != 2 or a.shape[0] != rows or a.shape[1] < 1 or (cols is not None and a.shape[1] != cols):
            want = f"[{rows}, {cols if cols is not None else 'N >= 1'}]"
            self.fail(arg, f"expected shape {want} (got {list(a.shape)})")
        return a.shape[1]

    def real_bsz(self, arg: str, r: int, b: int) -> None:
        if not 1 <= r <= b:
            self.fail(arg, f"has {r} elements; 1 <= R <= B = {b} is required")

    def int_attr(self, arg: str, value, minimum: int) -> None:
        """An `int` attribute (bool is rejected) with a lower bound."""
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            self.fail(arg, f"expected int (got {type(value).__name__})")
        if value < minimum:
            self.fail(arg, f"must be >= {minimum} (got {value})")

    def bool_attr(self, arg: str, value) -> None:
        if not isinstance(value, (bool, np.bool_)):
            self.fail(arg, f"expected bool (got {type(value).__name__})")

    def no_shared_storage(self, named: list[tuple[str, np.ndarray]]) -> None:
        """No two tensor arguments share storage (OPS §2.2); the later argument of a pair is reported."""
        for j, (name_j, a_j) in enumerate(named):
            for name_i, a_i in named[:j]:
                if np.shares_memory(a_i, a_j):
                    self.fail(name_j, f"shares storage with '{name_i}'")


def flat(a: np.ndarray) -> np.ndarray:
    """The flat view of a contiguous per-slot vector ([N] or [N, 1]); writes go through to `a`."""
    return a.reshape(-1)

