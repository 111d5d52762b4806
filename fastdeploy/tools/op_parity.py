"""Compares a Kunlun3 backend with the C++ CPU path on seeded random states (OPS §2.1, §8 C1): the self-check's
device check, or its emulator equivalent where there is no device.

The random in-domain states come from the test tree's generators (`tests/reference/inputs.py`, OPS §8 C1), so this
part needs a source checkout (the P800 operator installs from one); without it the part reports that and is
skipped, never faked.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paddle

from fastdeploy.model_executor.ops import state_ops as ops

# OPS §2.2: host tensors on every backend.
HOST_ARGS = ("not_need_stop", "preempted_idx")
TESTS_DIR = Path(__file__).resolve().parents[2] / "tests"


@dataclass(slots=True)
class ParityRow:
    op: str
    backend: str
    ncluster: int
    cases: int
    mismatches: int
    first_mismatch: str  # "" when every case matched


def load_generators():
    """tests/reference/inputs.py's module, or None without a source checkout."""
    if not (TESTS_DIR / "reference" / "inputs.py").is_file():
        return None
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    return importlib.import_module("reference.inputs")


def _run(case, backend: str, ncluster: int, place):
    """Runs `case` with tensors on `place` (host arguments stay on the host); returns (tensors, result) as NumPy."""
    tensors = {name: None if a is None else paddle.to_tensor(a, place=paddle.CPUPlace() if name in HOST_ARGS else place)
               for name, a in case.tensors.items()}
    context = ops.use_backend("cpu") if backend == "cpu" else ops.use_backend(backend, ncluster=ncluster)
    with context:
        result = getattr(ops, case.op)(*tensors.values(), *case.attrs.values())
    return ({name: None if t is None else t.numpy() for name, t in tensors.items()},
            None if result is None else result.numpy())


def _difference(expected, actual) -> str:
    """Name of the first tensor (or "result") that differs, "" if none."""
    (exp_tensors, exp_result), (act_tensors, act_result) = expected, actual
    for name, exp in exp_tensors.items():
        act = act_tensors[name]
        if (exp is None) != (act is None) or (exp is not None and not np.array_equal(exp, act)):
            return name
    if (exp_result is None) != (act_result is None) or (exp_result is not None
                                                        and not np.array_equal(exp_result, act_result)):
        return "result"
    return ""


def check_parity(generators, backend: str, clusters: list[int], cases: int, place, seed: int = 0) -> list[ParityRow]:
    """Per op and cluster count: `cases` random states through the CPU path and through `backend` on `place`."""
    rows = []
    for op in generators.GENERATORS:
        for ncluster in clusters:
            rng = np.random.default_rng([seed, ncluster])
            mismatches, first = 0, ""
            for i in range(cases):
                B = int(rng.integers(1, 65))
                R = B if rng.random() < 0.5 else int(rng.integers(1, B + 1))
                T = int(rng.integers(1, 9))
                case = generators.gen_inputs(op, seed * 100_000 + i, B, R, T)
                diff = _difference(_run(case.copy(), "cpu", 0, paddle.CPUPlace()),
                                   _run(case.copy(), backend, ncluster, place))
                if diff:
                    mismatches += 1
                    first = first or f"case {i} (B={B}, R={R}, T={T}): '{diff}' differs"
            rows.append(ParityRow(op, backend, ncluster, cases, mismatches, first))
    return rows
