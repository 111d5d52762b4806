"""Median latency per call of the speculative-decoding state ops, beside the dispatch floor and the NumPy reference.

Prints one row per (op, B, T): the op through its Python entry (`fastdeploy.model_executor.ops.state_ops`, Paddle CPU
tensors), the plugin through the pybind module (NumPy arrays, no Paddle), two dispatch floors, the NumPy reference,
and the ratios op/floor1, op/floor=sig and reference/op. The floors are registered custom ops that do nothing,
called through the same Python entry as the ops: `fd_dispatch_floor` (floor1: one int32 tensor) and
`fd_dispatch_floor_<op>` (floor=sig: the op's own tensors, in-place map and attributes). op/floor=sig is what the
project's layers (entry checks, op layer, plugin) add to the cost Paddle charges for the op's signature.

Every timed call starts from the same input state: mutated tensors are restored outside the timed region, so a
call never benefits from the previous one having stopped or parked its slots. The op and its floors are timed in
interleaved rounds so that load from other processes hits all three alike.

The Python entry calls each op's kernel through the extension's own Python module (`_paddle_ops`,
custom_ops/xpu_ops/src/ops/mtp/python_calls.cc), not through Paddle's custom-op entry `_run_custom_op`, which copies
every registered op's metadata on each call. `--breakdown` instead splits one call per op at B = 256, T = 2 into
the call through the module (floor=sig through it, no Python entry), the project's C++ op layer + plugin (the op
through the module minus that floor) and the Python entry (the op through its entry minus the module call), beside
what the same floor costs through Paddle's `_run_custom_op`.

    python benchmarks/ops_latency.py [--quick] [--breakdown] [--backend cpu|xpu3-emulator] [--ncluster N]
"""

import argparse
import os
import statistics
import sys
import time

import paddle

# The NumPy reference lives with the tests; the checkout root makes an in-place build importable too.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from reference.inputs import GENERATORS, gen_inputs, run_reference  # noqa: E402

from fastdeploy.model_executor.ops import _kl3_pybind, _loader  # noqa: E402
from fastdeploy.model_executor.ops import state_ops as ops  # noqa: E402

SEED = 2026


def samples_ns(call, restore, repeats: int) -> list:
    """Wall times of `repeats` calls of `call()` in nanoseconds; `restore()` runs before each call, untimed."""
    samples = []
    for _ in range(repeats):
        restore()
        t0 = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - t0)
    return samples


def median_us(call, restore, repeats: int) -> float:
    """Median wall time of `call()` in microseconds; `restore()` runs before each call, untimed."""
    return statistics.median(samples_ns(call, restore, repeats)) / 1e3


def interleaved_medians_us(timed, repeats: int, rounds: int = 10) -> list:
    """Median time in microseconds of each (call, restore) pair of `timed`, measured in `rounds` alternating
    rounds of repeats / rounds calls each, so that a burst of outside load falls on every pair alike."""
    samples = [[] for _ in timed]
    for _ in range(rounds):
        for i, (call, restore) in enumerate(timed):
            samples[i] += samples_ns(call, restore, max(1, repeats // rounds))
    return [statistics.median(s) / 1e3 for s in samples]


def paddle_case(case):
    """The case's arguments as Paddle CPU tensors (None stays None), their attributes, and a restore function
    that resets every tensor to the generated input."""
    tensors = {k: None if v is None else paddle.to_tensor(v, place=paddle.CPUPlace()) for k, v in case.tensors.items()}

    def restore():
        for k, v in case.tensors.items():
            if v is not None:
                tensors[k].set_value(v)

    return list(tensors.values()), list(case.attrs.values()), restore


def backend_context(backend, ncluster):
    return ops.use_backend(backend) if backend == "cpu" else ops.use_backend(backend, ncluster=ncluster)


def time_op_and_floors(case, backend, ncluster, repeats):
    """(op, floor1, floor=sig) median microseconds, interleaved."""
    args, attrs, restore = paddle_case(case)
    fn = getattr(ops, case.op)
    x = paddle.zeros([1], dtype="int32")
    timed = [(lambda: fn(*args, *attrs), restore),
             (lambda: ops.fd_dispatch_floor(x), lambda: None),
             (lambda: ops.fd_dispatch_floor_as(case.op, *args, *attrs), lambda: None)]
    with backend_context(backend, ncluster):
        for call, reset in timed:  # warm-up: first-call dispatch caches
            reset()
            call()
        return interleaved_medians_us(timed, repeats)


def time_pybind(case, ncluster, repeats):
    arrays = {k: None if v is None else v.copy() for k, v in case.tensors.items()}
    fn = getattr(_kl3_pybind, case.op)
    args, attrs = list(arrays.values()), list(case.attrs.values())

    def restore():
        for k, v in case.tensors.items():
            if v is not None:
                arrays[k][...] = v

    return median_us(lambda: fn(*args, *attrs, ncluster=ncluster), restore, repeats)


def registered_name(op, args):
    """The Paddle registration the Python entry of `op` calls for these arguments."""
    if op == "recover_decode_task" and args[7] is not None:
        return "recover_spec_decode_task"
    return op


def breakdown(backend, ncluster, repeats):
    """Per op at B = 256, T = 2: the module's call for the op's signature, the C++ op layer + plugin, the Python
    entry, and Paddle's `_run_custom_op` for the same signature (median microseconds, interleaved; differences are
    medians of per-round differences)."""
    paddle_run = paddle._C_ops._run_custom_op
    module = _loader.python_module("_paddle_ops")
    print(f"backend={backend} ncluster={ncluster}  B=256 T=2  (medians over rounds of {repeats // 10} calls)")
    header = (f"{'op':38} {'tensors':>7} {'call us':>7} {'layer+plugin us':>15} {'entry us':>8} {'op us':>7} "
              f"{'paddle call us':>14}")
    print(header)
    print("-" * len(header))
    for op in GENERATORS:
        case = gen_inputs(op, SEED, 256, 256, 2)
        if "rank_id" in case.attrs:
            case.attrs.update(rank_id=0)
        args, attrs, restore = paddle_case(case)
        tensors = [t for t in args if t is not None]
        name = registered_name(op, args)
        fn = getattr(ops, op)
        floor = getattr(module, "fd_dispatch_floor_" + name)
        kernel = getattr(module, name)
        timed = [(lambda: floor(*tensors, *attrs, ncluster), restore),
                 (lambda: kernel(*tensors, *attrs, ncluster), restore),
                 (lambda: fn(*args, *attrs), restore),
                 (lambda: paddle_run("fd_dispatch_floor_" + name, *tensors, *attrs, ncluster), restore)]
        with backend_context(backend, ncluster):
            for call, reset in timed:
                reset()
                call()
            rounds = [interleaved_medians_us(timed, repeats // 10, rounds=1) for _ in range(10)]
        call, _, entry, paddle_call = (statistics.median(r[i] for r in rounds) for i in range(4))
        layer = statistics.median(r[1] - r[0] for r in rounds)
        python = statistics.median(r[2] - r[1] for r in rounds)
        print(f"{op:38} {len(tensors):>7} {call:>7.2f} {layer:>15.2f} {python:>8.2f} {entry:>7.2f} "
              f"{paddle_call:>14.2f}")


def time_reference(case, repeats):
    return median_us(lambda: run_reference(case), lambda: None, repeats) - median_us(case.copy, lambda: None, repeats)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repetitions (smoke run)")
    parser.add_argument("--breakdown", action="store_true", help="split one call per op into its layers")
    parser.add_argument("--backend", default="cpu", choices=["cpu", "xpu3-emulator"])
    parser.add_argument("--ncluster", type=int, default=12, help="clusters for the emulator backend")
    opts = parser.parse_args(argv)

    batches, widths = ([8, 256], [2]) if opts.quick else ([8, 64, 256, 512], [2, 6])
    repeats, ref_repeats = (300, 20) if opts.quick else (3000, 100)
    ncluster = 0 if opts.backend == "cpu" else opts.ncluster
    if opts.breakdown:
        breakdown(opts.backend, ncluster, repeats)
        return
    shapes = [(op, B, T) for op in GENERATORS for B in batches for T in widths]

    rows = []
    for i, (op, B, T) in enumerate(shapes, 1):
        print(f"[{i}/{len(shapes)}] {op} B={B} T={T}", file=sys.stderr, flush=True)
        case = gen_inputs(op, SEED, B, B, T)
        if "rank_id" in case.attrs:
            case.attrs.update(rank_id=0)  # time the message assembly, not the early return of other ranks
        try:
            t_op, t_floor1, t_floor_sig = time_op_and_floors(case, opts.backend, ncluster, repeats)
        except RuntimeError as e:  # e.g. a Kunlun3 kernel not built into the emulator yet
            print(f"  skipped: {e}", file=sys.stderr)
            continue
        t_plugin = time_pybind(case, ncluster, repeats)
        t_ref = time_reference(case, ref_repeats)
        rows.append((op, B, T, t_op, t_floor1, t_floor_sig, t_plugin, t_ref))

    header = (f"{'op':38} {'B':>4} {'T':>2} {'op us':>7} {'floor1':>6} {'fl=sig':>6} {'pybind':>6} {'ref us':>8} "
              f"{'op/floor1':>9} {'op/fl=sig':>9} {'ref/op':>6}")
    print(f"backend={opts.backend} ncluster={ncluster}  (medians of {repeats} calls, interleaved; "
          f"reference: {ref_repeats})")
    print(header)
    print("-" * len(header))
    for op, B, T, t_op, t_floor1, t_floor_sig, t_plugin, t_ref in rows:
        print(f"{op:38} {B:>4} {T:>2} {t_op:>7.2f} {t_floor1:>6.2f} {t_floor_sig:>6.2f} {t_plugin:>6.2f} "
              f"{t_ref:>8.1f} {t_op / t_floor1:>9.2f} {t_op / t_floor_sig:>9.2f} {t_ref / t_op:>6.1f}")


if __name__ == "__main__":
    main()
