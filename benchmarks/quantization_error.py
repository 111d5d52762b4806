"""What each precision does to a trained model's weights and predictions (docs/benchmarks.md "Quantization error"):
fd-tiny (trained, shipped in the package) with every linear layer's weights replaced by what the precision stores
(bf16 rounding; WINT8 / WINT4 quantize -> dequantize, OPS §10.2; the embedding and the head rounded to bf16, never
quantized), teacher-forced over held-out text from fd-tiny's own corpus generator, against the float32 model:

layer error   ||W' - W|| / ||W|| per linear layer (Frobenius), mean and worst
agreement     the share of positions where the next token (argmax) equals the float32 model's
loss          the target's cross-entropy on the text (float32: the trained model's own)

The weights alone: each linear's bf16 rounding of its input (the CPU kernel's, OPS §10.3) is not applied here.
Usage: python benchmarks/quantization_error.py [--rows 8] [--length 160]
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("float32", "bfloat16", "wint8", "wint4")


def corpus(rows: int, length: int) -> np.ndarray:
    """[rows, length + 1] held-out ids from scripts/train_fd_tiny.py's generator (a seed training never used)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from train_fd_tiny import make_batch
    from fastdeploy.model_executor.models.tokenizer import ByteTokenizer
    return make_batch(random.Random(987654321), ByteTokenizer(), rows, length)


def stored_weights(weight: np.ndarray, method: str, quantized: bool) -> np.ndarray:
    from fastdeploy.model_executor.layers.quantization.weight_only import dequantize, quantize, round_to_bf16
    if method == "float32":
        return weight
    if method == "bfloat16" or not quantized:
        return round_to_bf16(weight)
    return dequantize(*quantize(weight, 8 if method == "wint8" else 4, "bfloat16"))


def measure(ids: np.ndarray) -> dict[str, dict[str, float]]:
    import paddle
    import paddle.nn.functional as F

    from fastdeploy.model_executor.layers.transformer import DenseCausalAttention, Linear
    from fastdeploy.model_executor.models.fd_tiny import FdTiny

    b, t = ids.shape[0], ids.shape[1] - 1
    x = paddle.to_tensor(ids[:, :t].reshape(-1))
    positions = paddle.to_tensor(np.tile(np.arange(t), b))
    labels = paddle.to_tensor(ids[:, 1:].reshape(-1, 1))
    results, reference = {}, None
    for method in METHODS:
        net = FdTiny.from_pretrained().net
        errors = []
        with paddle.no_grad():
            for name, layer in net.named_sublayers():
                if isinstance(layer, Linear):
                    w = layer.weight.numpy()
                    stored = stored_weights(w, method, quantized=not name.endswith("lm_head"))
                    if not name.endswith("lm_head"):
                        errors.append(float(np.linalg.norm(stored - w) / np.linalg.norm(w)))
                    layer.weight.set_value(stored)
            net.embed.weight.set_value(stored_weights(net.embed.weight.numpy(), method, quantized=False))
            logits = net.logits(net.target_hidden(x, positions, DenseCausalAttention(b, t)))
            loss = float(F.cross_entropy(logits, labels))
        top = logits.numpy().argmax(-1)
        reference = top if reference is None else reference
        results[method] = {"layer error mean": float(np.mean(errors)), "layer error worst": float(np.max(errors)),
                           "agreement": float((top == reference).mean()), "loss": loss, "positions": top.size}
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=160)
    args = parser.parse_args(argv)
    results = measure(corpus(args.rows, args.length))
    print(f"fd-tiny, {results['float32']['positions']} held-out positions")
    print(f"{'precision':<10}{'layer error mean':>18}{'worst':>10}{'agreement':>11}{'loss':>9}")
    for method, r in results.items():
        print(f"{method:<10}{r['layer error mean']:>18.5f}{r['layer error worst']:>10.5f}{r['agreement']:>11.4f}"
              f"{r['loss']:>9.4f}")


if __name__ == "__main__":
    main()
