"""Where a real-shaped decode pass spends the time its CPU ops do not: the host's code between two ops, measured in
the pass, against the same code with its caches warm. Prints two tables.

step          `Model.forward` of one decode step (`--rows` sequences, one token each at context `--context`, each
              over its own blocks: real_shapes.batch_decode) on a real_shapes.py checkpoint (`--shape`, written
              here, or `--checkpoint`) in `--precision` (real_shapes.PRECISIONS); the CPU ops (`fd_cpu_linear`,
              `fd_cpu_rms_norm`, `fd_cpu_rope_cache_write`, `fd_cpu_decode_attention`, `fd_cpu_swiglu_mlp`,
              `fd_cpu_moe_route`, `fd_cpu_moe_experts`, `fd_cpu_attention_block`, `fd_cpu_decoder_stack`) timed
              by a wrapper at their Python entry, and the gaps between one op's return and the next op's call,
              summed by (op, next op);
              a dense model's decode pass is one `fd_cpu_decoder_stack` call (OPS §13.4), so its layers' gaps are
              inside it (`--layers-apart`: each layer's ops instead)
warm glue     the same pass with every CPU op answered from a table of its outputs (no weight read at all): what
              the code between the ops costs with its instructions and data in cache
after a read  one call of a few operations (Paddle's swiglu, reshape and add, an own op, a dtype check), each
              first after reading `--read-mib` MiB (what a pass's products stream between two such calls), against
              the same call back to back: how much of a gap is its code and data coming back from memory

Usage: python benchmarks/op_gaps.py [--shape ernie-0.3b] [--rows 1 16] [--context 256] [--reps 7] [--threads 1]
       [--checkpoint DIR] [--precision float32] [--read-mib 0 2 16 256] [--layers-apart] [--smoke]
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadMeter, load_line  # noqa: E402
from benchmarks import real_shapes  # noqa: E402

OPS = {"fd_cpu_linear": lambda a: f"linear {a[3]}x{a[4]}", "fd_cpu_rms_norm": lambda a: "rms_norm",
       "fd_cpu_rope_cache_write": lambda a: "rope_cache_write", "fd_cpu_decode_attention": lambda a: "attention",
       "fd_cpu_swiglu_mlp": lambda a: f"norm + mlp {a[8]}x{a[9]}",
       "fd_cpu_moe_experts": lambda a: f"moe experts x{len(a[4])}",
       "fd_cpu_attention_block": lambda a: f"norm + attention, {a[16]} heads",
       "fd_cpu_decoder_stack": lambda a: f"decoder stack x{len(a[8])}", "fd_cpu_moe_route": lambda a: "moe route"}
BLOCK = 16


class OpClock:
    """Wraps the CPU ops' module functions: each op's time by name, and each gap (an op's return to the next op's
    call) by (op, next op). `answer_from_table` makes every op return its first output for the same arguments'
    shapes instead of computing (the warm-glue pass)."""

    def __init__(self, module):
        self.module, self.saved = module, {name: getattr(module, name) for name in OPS}
        self.ops, self.gaps, self.calls = collections.Counter(), collections.Counter(), collections.Counter()
        self.last, self.last_at, self.table = None, 0.0, {}
        self.answer_from_table = False
        for name, label in OPS.items():
            setattr(module, name, self._timed(self.saved[name], name, label))

    def _timed(self, fn, name, label):
        def call(*args):
            started = time.perf_counter()
            key = label(args)
            if self.last is not None:
                self.gaps[(self.last, key)] += started - self.last_at
                self.calls[(self.last, key)] += 1
            if self.answer_from_table:
                table_key = (name, tuple(tuple(a.shape) if hasattr(a, "shape") else len(a) if isinstance(a, list)
                                         else a for a in args[:5]))
                if table_key not in self.table:
                    self.table[table_key] = fn(*args)
                out = self.table[table_key]
            else:
                out = fn(*args)
            self.last, self.last_at = key, time.perf_counter()
            self.ops[key] += self.last_at - started
            return out
        return call

    def reset(self) -> None:
        for counts in (self.ops, self.gaps, self.calls):
            counts.clear()
        self.last = None

    def restore(self) -> None:
        for name, fn in self.saved.items():
            setattr(self.module, name, fn)


def pass_times(model, rows: int, context: int, reps: int) -> None:
    import numpy as np

    from fastdeploy.model_executor.ops import _loader

    blocks = -(-(context + 8) // BLOCK)
    kv, batch = real_shapes.batch_decode(model, context, blocks, BLOCK, np.random.default_rng(0), rows)
    clock = OpClock(_loader.cpu_ops())
    try:
        steps = []
        for warm in (False, True):
            clock.answer_from_table = warm
            for _ in range(2):
                model.forward(batch, kv)
            clock.reset()
            times = []
            for _ in range(reps):
                clock.last = None
                started = time.perf_counter()
                model.forward(batch, kv)
                times.append(time.perf_counter() - started)
            steps.append(statistics.median(times) * 1e3)
            if not warm:
                ops = {k: v * 1e3 / reps for k, v in clock.ops.items()}
                gaps = {k: (v * 1e3 / reps, clock.calls[k] // reps) for k, v in clock.gaps.items()}
    finally:
        clock.restore()
    print(f"\n{rows} row(s), context {context}: step {steps[0]:.2f} ms, the CPU ops {sum(ops.values()):.2f} ms, "
          f"the gaps between them {sum(g for g, _ in gaps.values()):.2f} ms; warm glue (ops answered from a table) "
          f"{steps[1]:.2f} ms")
    for name, ms in sorted(ops.items(), key=lambda item: -item[1]):
        print(f"  op   {name:<38}{ms:9.2f} ms")
    for (before, after), (ms, count) in sorted(gaps.items(), key=lambda item: -item[1][0]):
        print(f"  gap  {before + ' -> ' + after:<38}{ms:9.2f} ms  ({count} a step, {ms * 1e3 / count:.1f} us each)")


def after_a_read(read_mib: list[float]) -> None:
    import numpy as np
    import paddle
    import paddle.nn.functional as F

    from fastdeploy.model_executor.ops import _loader

    ops = _loader.cpu_ops()
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.standard_normal((1, 1024)).astype(np.float32))
    w = paddle.to_tensor(np.ones(1024, np.float32))
    heads = paddle.to_tensor(rng.standard_normal((1, 16, 128)).astype(np.float32))
    gate_up = paddle.to_tensor(rng.standard_normal((1, 6144)).astype(np.float32))
    calls = {"Paddle swiglu [1, 6144]": lambda: F.swiglu(gate_up),
             "Paddle reshape [1, 16, 128] -> [1, 2048]": lambda: heads.reshape([1, 2048]),
             "Paddle add [1, 1024]": lambda: x + x,
             "fd_cpu_rms_norm [1, 1024] (own op)": lambda: ops.fd_cpu_rms_norm(x, w, x, 1e-5),
             "x.dtype == paddle.float32": lambda: x.dtype == paddle.float32}
    print(f"\n{'call (us, median of 200)':<44}" + "".join(f"{f'after {m:g} MiB':>16}" for m in read_mib))
    for name, fn in calls.items():
        cells = []
        for mib in read_mib:
            data = np.ones(max(1, int(mib * 2 ** 18)), np.float32)
            times = []
            for _ in range(200):
                if mib:
                    data.sum()
                started = time.perf_counter()
                fn()
                times.append(time.perf_counter() - started)
            cells.append(statistics.median(times) * 1e6)
        print(f"{name:<44}" + "".join(f"{c:16.1f}" for c in cells))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(real_shapes.SHAPES), default="ernie-0.3b")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint", help="a checkpoint directory of the --shape (skip writing one)")
    parser.add_argument("--precision", choices=list(real_shapes.PRECISIONS), default="float32")
    parser.add_argument("--read-mib", type=float, nargs="+", default=[0, 2, 16, 256])
    parser.add_argument("--layers-apart", action="store_true",
                        help="run a dense model's layers one by one, not as one fd_cpu_decoder_stack")
    parser.add_argument("--smoke", action="store_true", help="tiny dimensions: check that the script runs")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from fastdeploy.model_executor.layers import cpu_rms_norm
    from fastdeploy.model_executor.models import get_model
    if not cpu_rms_norm.AVAILABLE:
        sys.exit("the CPU ops need the CPU's own AVX-512 kernels (not on this CPU)")
    meter = LoadMeter()
    meter.start()
    with tempfile.TemporaryDirectory(prefix="fd-op-gaps-") as tmp:
        path = real_shapes.checkpoint_of(args.shape, args.checkpoint, tmp, args.smoke)
        dtype, quantization = real_shapes.PRECISIONS[args.precision]
        model = get_model(path, dtype=dtype, quantization=quantization)
        if args.layers_apart:
            model.net.layers_in_one_op = False
        print(f"op_gaps: {args.shape}{' (smoke)' if args.smoke else ''}, {args.precision}, {args.threads} thread(s)")
        for rows in args.rows:
            pass_times(model, rows, args.context, args.reps)
    after_a_read(args.read_mib)
    print(load_line(meter.stop()))


if __name__ == "__main__":
    main()
