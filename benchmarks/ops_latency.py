"""Median latency per call of the speculative-decoding state ops, beside the dispatch floor and the NumPy reference.

Prints one row per (op, B, T): the op through its Python entry (`fastdeploy.model_executor.ops.xpu`, Paddle CPU
tensors), the plugin through the pybind module (NumPy arrays, no Paddle), the dispatch floor (`fd_dispatch_floor`,
a registered custom op that does nothing), the NumPy reference, and the ratios op/floor and reference/op.

Every timed call starts from the same input state: mutated tensors are restored outside the timed region, so a
call never benefits from the previous one having stopped or parked its slots.

    python benchmarks/ops_latency.py [--quick] [--backend cpu|xpu3-emulator] [--ncluster N]
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import paddle

# The NumPy reference lives with the tests; the checkout root makes an in-place build importable too.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from reference.inputs import GENERATORS, gen_inputs, run_reference  # noqa: E402

from fastdeploy.model_executor.ops import _kl3_pybind  # noqa: E402
from fastdeploy.model_executor.ops import xpu as ops  # noqa: E402

SEED = 2026


def median_us(call, restore, repeats: int) -> float:
    """Median wall time of `call()` in microseconds; `restore()` runs before each call, untimed."""
    samples = []
    for _ in range(repeats):
        restore()
        t0 = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1e3


def time_op(case, backend, ncluster, repeats):
    originals = {k: v for k, v in case.tensors.items() if v is not None}
    tensors = {k: None if v is None else paddle.to_tensor(v, place=paddle.CPUPlace()) for k, v in case.tensors.items()}
    args, attrs = list(tensors.values()), list(case.attrs.values())
    fn = getattr(ops, case.op)

    def restore():
        for k, v in originals.items():
            tensors[k].set_value(v)

    ctx = ops.use_backend(backend) if backend == "cpu" else ops.use_backend(backend, ncluster=ncluster)
    with ctx:
        fn(*args, *attrs)  # warm-up: first-call dispatch caches
        return median_us(lambda: fn(*args, *attrs), restore, repeats)


def time_pybind(case, ncluster, repeats):
    arrays = {k: None if v is None else v.copy() for k, v in case.tensors.items()}
    fn = getattr(_kl3_pybind, case.op)
    args, attrs = list(arrays.values()), list(case.attrs.values())

    def restore():
        for k, v in case.tensors.items():
            if v is not None:
                arrays[k][...] = v

    return median_us(lambda: fn(*args, *attrs, ncluster=ncluster), restore, repeats)


def time_floor(repeats):
    """The do-nothing custom op (one int32 tensor in place, the `ncluster` attribute like the state ops)."""
    x = paddle.zeros([1], dtype="int32")
    floor = ops.fd_dispatch_floor
    floor(x)
    return median_us(lambda: floor(x), lambda: None, repeats)


def time_reference(case, repeats):
    return median_us(lambda: run_reference(case), lambda: None, repeats) - median_us(case.copy, lambda: None, repeats)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repetitions (smoke run)")
    parser.add_argument("--backend", default="cpu", choices=["cpu", "xpu3-emulator"])
    parser.add_argument("--ncluster", type=int, default=12, help="clusters for the emulator backend")
    opts = parser.parse_args(argv)

    batches, widths = ([8, 256], [2]) if opts.quick else ([8, 64, 256, 512], [2, 6])
    repeats, ref_repeats = (300, 20) if opts.quick else (3000, 100)
    ncluster = 0 if opts.backend == "cpu" else opts.ncluster
    shapes = [(op, B, T) for op in GENERATORS for B in batches for T in widths]

    rows = []
    for i, (op, B, T) in enumerate(shapes, 1):
        print(f"[{i}/{len(shapes)}] {op} B={B} T={T}", file=sys.stderr, flush=True)
        case = gen_inputs(op, SEED, B, B, T)
        if "rank_id" in case.attrs:
            case.attrs.update(rank_id=0)  # time the message assembly, not the early return of other ranks
        # The floor is measured right beside each op so that load from other processes affects both alike.
        t_floor = time_floor(repeats)
        try:
            t_op = time_op(case, opts.backend, ncluster, repeats)
        except RuntimeError as e:  # e.g. a Kunlun3 kernel not built into the emulator yet
            print(f"  skipped: {e}", file=sys.stderr)
            continue
        t_plugin = time_pybind(case, ncluster, repeats)
        t_ref = time_reference(case, ref_repeats)
        rows.append((op, B, T, t_op, t_floor, t_plugin, t_ref))

    header = (f"{'op':38} {'B':>4} {'T':>2} {'op us':>8} {'floor us':>8} {'pybind us':>9} {'ref us':>9} "
              f"{'op/floor':>8} {'ref/op':>7}")
    print(f"backend={opts.backend} ncluster={ncluster}  (medians of {repeats} calls; reference: {ref_repeats})")
    print(header)
    print("-" * len(header))
    for op, B, T, t_op, t_floor, t_plugin, t_ref in rows:
        print(f"{op:38} {B:>4} {T:>2} {t_op:>8.2f} {t_floor:>8.2f} {t_plugin:>9.2f} {t_ref:>9.1f} "
              f"{t_op / t_floor:>8.2f} {t_ref / t_op:>7.1f}")


if __name__ == "__main__":
    main()
