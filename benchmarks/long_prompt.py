"""Long prompts on real-shaped checkpoints with random weights made here: time to first token against
transformers' forward of the same prompt, and prefill time per token at each chunk size.

Shapes: `dense-135m` (a Llama-architecture checkpoint of 30 layers, hidden 576, 9 query / 3 KV heads of 64,
intermediate 1536, vocabulary 49152: the 135M-parameter dense shape of issue measurements) and `ernie-0.3b`
(benchmarks/real_shapes.py's ERNIE-4.5-0.3B configuration). Each is written once into a temporary directory as
real_shapes.write_checkpoint writes it and loaded with `get_model` / `LLM` in float32. Two tables per shape:

ttft          for each `--prompts` length L: the in-process engine's time to first token (`LLM.generate` of an
              L-token prompt with max_tokens 1 at `--max-num-batched-tokens`, so the prompt runs in chunks of
              that size), transformers' forward of the same tokens in a subprocess (torch never shares a process
              with paddle; `logits_to_keep=1`, as the engine asks the head for the last row only; its default
              attention, SDPA), and their ratio; then the same prompt through the in-process PD pair
              (`LLM(splitwise=True)`: P prefills and hands the KV off; timed to D taking it in) and its ratio to
              the engine's (`--no-pd` skips it)
per token     one `--chunk-prompt`-token prompt prefilled by `Model.forward` in chunks of each `--chunks` size
              (each chunk reads the earlier ones from the cache): total ms, ms per prompt token, and the ratio to
              the smallest chunk size's per-token time (flat = the cost follows the work)

Both engines run `--threads` CPU threads (OMP_NUM_THREADS / torch.set_num_threads). The load column says how much
of the machine other processes took (benchmarks/load.py); a loaded run's ratios are not results. What bounds each
figure is in docs/benchmarks.md "Long prompts". `--smoke` shrinks the shapes (hidden 128, 2 layers, vocabulary
2048) and the lengths to check that the script runs.

Usage: python benchmarks/long_prompt.py [--shape dense-135m ernie-0.3b] [--prompts 2048 8192]
       [--max-num-batched-tokens 2048] [--chunk-prompt 8192] [--chunks 256 512 1024 2048 4096 8192]
       [--threads 1] [--no-pd] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.load import LoadMeter, ratio_text  # noqa: E402
from benchmarks.real_shapes import COMMON, SHAPES, SMOKE, write_checkpoint  # noqa: E402

LONG_SHAPES = {name: SHAPES[name] for name in ("dense-135m", "ernie-0.3b")}


def shape_config(name: str, smoke: bool) -> dict:
    config = {**COMMON, **LONG_SHAPES[name], "rope_theta": 10000.0}
    if smoke:
        config.update({k: v for k, v in SMOKE.items() if k in config})
        config["num_hidden_layers"] = 2
    return config


def prompt_tokens(length: int, vocab: int) -> list[int]:
    """The prompt both engines see: seeded ids past the special tokens."""
    return np.random.default_rng(1).integers(3, vocab, length).tolist()


def engine_ttft(path: str, tokens: list[int], chunk: int, splitwise: bool = False) -> float:
    """Seconds from submitting the prompt to its first token, in-process engine, one request. `splitwise`: through
    the in-process PD pair, up to D taking in P's hand-off, KV included (`PDTimings.decode_start_s`: where a PD
    service streams t0 from); max_tokens 2 there, since a t0 that ends the request travels without its KV."""
    from fastdeploy import LLM, SamplingParams

    llm = LLM(model=path, max_num_seqs=1, max_model_len=len(tokens) + 8, max_num_batched_tokens=chunk,
              splitwise=splitwise)
    params = SamplingParams(max_tokens=2 if splitwise else 1, ignore_eos=True)
    llm.generate([tokens[:16]], params, use_tqdm=False)     # warm-up: tables, allocator
    start = time.perf_counter()
    output = llm.generate([tokens], params, use_tqdm=False)[0]
    return (output.pd_timings.decode_start_s if splitwise else time.perf_counter()) - start


def chunked_prefill_s(path: str, tokens: list[int], chunk: int) -> float:
    """Seconds for Model.forward over the prompt in chunks of `chunk` tokens (the head on each chunk's last row)."""
    from fastdeploy.model_executor.models import get_model
    from fastdeploy.model_executor.models.base import ForwardBatch

    model = get_model(path, dtype="float32")
    block = 64
    blocks = -(-len(tokens) // block)
    kv = model.new_kv_cache(blocks, block)
    table = np.arange(blocks, dtype=np.int32)[None]
    ids = np.asarray(tokens, np.int64)

    def prefill(n: int) -> None:
        for start in range(0, n, chunk):
            part = ids[start:min(n, start + chunk)]
            batch = ForwardBatch(part, np.arange(start, start + part.size), [0, part.size], table)
            model.forward(batch, kv, np.array([part.size - 1]))

    prefill(min(16, len(tokens)))    # warm-up
    start = time.perf_counter()
    prefill(len(tokens))
    return time.perf_counter() - start


TRANSFORMERS_FORWARD = r"""
import json, sys, time, torch
from transformers import AutoModelForCausalLM
req = json.load(sys.stdin)
torch.set_num_threads(req["threads"])
model = AutoModelForCausalLM.from_pretrained(req["path"], dtype=torch.float32).eval()
ids = torch.tensor([req["tokens"]])
with torch.no_grad():
    model(ids[:, :16], logits_to_keep=1)
    start = time.perf_counter()
    model(ids, logits_to_keep=1)
    elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed}))
"""


def transformers_forward_s(path: str, tokens: list[int], threads: int) -> float:
    done = subprocess.run([sys.executable, "-c", TRANSFORMERS_FORWARD],
                          input=json.dumps(dict(path=path, tokens=tokens, threads=threads)), text=True,
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"transformers forward failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)["seconds"]


def run_shape(name: str, path: str, args) -> list[str]:
    config = json.loads((Path(path) / "config.json").read_text())
    lines = [f"{name}: {config['num_hidden_layers']} layers, hidden {config['hidden_size']}, heads "
             f"{config['num_attention_heads']}/{config['num_key_value_heads']} x {config['head_dim']}, float32, "
             f"{args.threads} thread(s)",
             f"{'prompt':>8} {'chunk':>6} {'engine TTFT s':>14} {'transformers s':>15} {'ratio':>6} "
             f"{'PD TTFT s':>10} {'PD/engine':>9}  load"]
    for length in args.prompts:
        tokens = prompt_tokens(length, config["vocab_size"])
        meter = LoadMeter()
        meter.start()
        ours = engine_ttft(path, tokens, args.max_num_batched_tokens)
        theirs = transformers_forward_s(path, tokens, args.threads)
        pd = engine_ttft(path, tokens, args.max_num_batched_tokens, splitwise=True) if args.pd else None
        reading = meter.stop()
        pd_text = f"{pd:>10.2f} {ratio_text(pd / ours, reading):>9}" if pd is not None else f"{'-':>10} {'-':>9}"
        lines.append(f"{length:>8} {args.max_num_batched_tokens:>6} {ours:>14.2f} {theirs:>15.2f} "
                     f"{ratio_text(ours / theirs, reading):>6} {pd_text}  {reading.describe()}")
    tokens = prompt_tokens(args.chunk_prompt, config["vocab_size"])
    lines.append(f"{'prompt':>8} {'chunk':>6} {'prefill s':>14} {'ms / token':>15} {'ratio':>6}  load")
    first = None
    for chunk in [c for c in args.chunks if c <= args.chunk_prompt]:
        meter = LoadMeter()
        meter.start()
        seconds = chunked_prefill_s(path, tokens, chunk)
        reading = meter.stop()
        per_token = seconds * 1e3 / len(tokens)
        first = first or (per_token, reading)
        lines.append(f"{len(tokens):>8} {chunk:>6} {seconds:>14.2f} {per_token:>15.3f} "
                     f"{ratio_text(per_token / first[0], reading, first[1]):>6}  {reading.describe()}")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", nargs="+", choices=list(LONG_SHAPES), default=["dense-135m"])
    parser.add_argument("--prompts", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--chunk-prompt", type=int, default=8192)
    parser.add_argument("--chunks", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-pd", dest="pd", action="store_false",
                        help="skip the TTFT through the in-process PD pair (LLM(splitwise=True))")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and lengths: check that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.prompts, args.chunk_prompt, args.chunks, args.max_num_batched_tokens = [40], 48, [16, 48], 16
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.shape:
            path = Path(tmp) / name
            write_checkpoint(path, shape_config(name, args.smoke), seed=0)
            print("\n".join(run_shape(name, str(path), args)), flush=True)


if __name__ == "__main__":
    main()
