"""A decode step with parts of the decoder as one op against the same step with their separate ops, on a
real-shaped checkpoint, in one process. Prints a table. The parts (`--forms`):
- mlp: `fd_cpu_swiglu_mlp` (the norm, gate|up, SwiGLU and down; an MoE's experts each one op without the norm,
  `fd_cpu_moe_experts`) against fd_cpu_rms_norm, fd_cpu_linear, Paddle's swiglu, fd_cpu_linear;
- attention: `fd_cpu_attention_block` (the norm, q|k|v, the rotation and cache write, the attention and the output
  product) against fd_cpu_rms_norm, fd_cpu_linear, fd_cpu_rope_cache_write, fd_cpu_decode_attention, fd_cpu_linear;
- stack: `fd_cpu_decoder_stack` (every layer, each half as one op, in one op) against each layer's halves as ops
  (with `--forms stack attention mlp`: against every op apart). Where stack is not chosen it is off on both sides
  (it would run in place of the layers' own forms).

one op, one by one  `Model.forward` of one decode step (`--rows` sequences, one token each at context `--context`,
                    each over its own blocks: real_shapes.batch_decode), median over `--reps` (ms); the two forms
                    alternate pass by pass on the same loaded model (the layers' SWITCHES of the chosen forms
                    flipped), so a drift of the machine's memory speed reaches both alike
ratio               the median of each pair's one-op time over its one-by-one time

Usage: python benchmarks/layer_one_op.py [--shape ernie-0.3b] [--precision float32 bfloat16 wint8]
       [--forms attention mlp] [--rows 1 16] [--context 256] [--reps 30] [--threads 1] [--checkpoint DIR] [--smoke]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import real_shapes  # noqa: E402
from benchmarks.load import LoadMeter, load_line  # noqa: E402

BLOCK = 16
# the layers' switches between one op and several, by form: a decoder layer's norm + MLP, a SwiGLU alone (MoE shared
# experts), the MoE's routed experts; a decoder layer's norm + attention; the dense decoder's layers all at once
SWITCHES = {"mlp": ("mlp_in_one_op", "in_one_op", "experts_in_one_op"), "attention": ("attn_in_one_op",),
            "stack": ("layers_in_one_op",)}


def paired_ms(model, rows: int, context: int, reps: int, forms: list[str]) -> tuple[float, float, float]:
    """(one op ms, one by one ms, median of the pairs' ratios) of one decode step, `forms` flipped."""
    import numpy as np

    def found(names):
        return [(layer, name) for layer in model.net.sublayers(include_self=True) for name in names
                if getattr(layer, name, False)]

    switches = found([name for form in forms for name in SWITCHES[form]])
    if not switches:
        raise SystemExit(f"no layer of this model runs its {' or '.join(forms)} as one op (not the CPU ops' "
                         "precision, or a MoE for the stack)")
    held_off = [] if "stack" in forms else found(SWITCHES["stack"])
    blocks = -(-(context + 8) // BLOCK)
    kv, batch = real_shapes.batch_decode(model, context, blocks, BLOCK, np.random.default_rng(0), rows)

    def step(one_op: bool) -> float:
        for layer, name in switches:
            setattr(layer, name, one_op)
        started = time.perf_counter()
        model.forward(batch, kv)
        return time.perf_counter() - started

    try:
        for layer, name in held_off:
            setattr(layer, name, False)
        for one_op in (True, False, True, False):
            step(one_op)
        pairs = [(step(True), step(False)) for _ in range(reps)]
    finally:
        for layer, name in switches + held_off:
            setattr(layer, name, True)
    return (statistics.median(a for a, _ in pairs) * 1e3, statistics.median(b for _, b in pairs) * 1e3,
            statistics.median(a / b for a, b in pairs))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(real_shapes.SHAPES), default="ernie-0.3b")
    parser.add_argument("--precision", nargs="+", choices=list(real_shapes.PRECISIONS),
                        default=["float32", "bfloat16", "wint8"])
    parser.add_argument("--forms", nargs="+", choices=list(SWITCHES), default=["attention", "mlp"],
                        help="the parts run as one op against their separate ops (together)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint", help="a checkpoint directory of the --shape (skip writing one)")
    parser.add_argument("--smoke", action="store_true", help="tiny dimensions: check that the script runs")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from fastdeploy.model_executor.layers import cpu_rms_norm
    from fastdeploy.model_executor.models import get_model
    if not cpu_rms_norm.AVAILABLE:
        sys.exit("the one-op forms need the CPU's own AVX-512 kernels (not on this CPU)")
    meter = LoadMeter()
    meter.start()
    print(f"layer_one_op: {args.shape}{' (smoke)' if args.smoke else ''}, {' + '.join(args.forms)} as one op, "
          f"context {args.context}, {args.threads} thread(s), {args.reps} pairs")
    print(f"{'precision':<10}{'rows':>5}{'one op ms':>12}{'one by one ms':>15}{'ratio':>8}")
    with tempfile.TemporaryDirectory(prefix="fd-layer-one-op-") as tmp:
        path = real_shapes.checkpoint_of(args.shape, args.checkpoint, tmp, args.smoke)
        for precision in args.precision:
            dtype, quantization = real_shapes.PRECISIONS[precision]
            model = get_model(path, dtype=dtype, quantization=quantization)
            for rows in args.rows:
                one, apart, ratio = paired_ms(model, rows, args.context, args.reps, args.forms)
                print(f"{precision:<10}{rows:>5}{one:>12.2f}{apart:>15.2f}{ratio:>8.3f}")
            del model
    print(load_line(meter.stop()))


if __name__ == "__main__":
    main()
