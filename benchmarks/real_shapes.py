"""Step times of real-shaped checkpoints with random weights made here (no download): the ERNIE-4.5-0.3B
configuration, a 21B-A3B-shaped MoE with fewer layers (64 experts, top-6, 2 shared, hidden 2560; docs/models.md)
and the 135M-parameter dense Llama shape (30 layers, hidden 576).

For each shape it writes a torch-layout checkpoint (config.json as published, random float32 tensors under the
published names, MTP tensors for the MoE, a word-level tokenizer.json of the model's vocabulary) into a temporary
directory and loads it with `get_model`, then prints one table:

prefill            one target pass over a `--prompt`-token prompt (ms)
decode b=1         one target pass of one token at context `--prompt` (ms), median of `--reps`
weights read once  the time to read every target weight byte once, as stored in the precision
                   (benchmarks/weight_read.py: a NumPy sum over a copy in huge pages, as the engine's weights are,
                   on `--threads` threads; timed in turn with the decode row, rep by rep), and scaled to the bytes
                   a batch-1 token touches ("active": all but the embedding table, of which it reads one row, and
                   the unrouted experts): the reference for a batch-1 step that must read its weights (not a
                   strict floor: a step can stream faster than a NumPy sum)
verify b=1, K=1    one target pass of 2 tokens (a round's verify: the last token and the draft) (ms)
decode b=16        one decode step of 16 sequences (a step at C = 16), each one token at context `--prompt` in
                   its own blocks of random cache values (ms); "decode b=16 / read" against the weights read once
decode / weights read, decode / active read, verify / decode, decode b=16 / read
                   the decode, read and verify rows are timed in turn, rep by rep: each ratio is the median of
                   the reps' own ratios, so a drift of the machine's speed between reps cancels
MTP b=1            one MTP pass of 1 token (the chained or the first draft), MoE only (ms)
round K=1          verify + MTP pass, against the plain decode step: the cost of one MTP round
and, with `--generate C ...`, greedy throughput (tokens/s) at each concurrency C of the in-process engine
(`LLM.generate`, K = 0 and K = 1), of the HTTP service with `--service` (`python -m
fastdeploy.entrypoints.openai.api_server --model DIR`, C concurrent /v1/completions clients on 127.0.0.1), and of
transformers' `generate` on the same checkpoint, batched C at a time, in a subprocess (torch never shares this
process with paddle), on the same machine. `--precision` runs each row in each precision (float32, bfloat16, wint8,
wint4: fastdeploy/precision.py; transformers stays float32, its fastest precision on this CPU), and prints the
weights' resident bytes against the arithmetic (parameters x bytes per stored element) and, for the 21B-A3B shape,
what the full 28-layer model needs per precision (arithmetic from its config).

What bounds each row is in docs/benchmarks.md "Real shapes". No number is recorded by this script: run it on a
quiet machine. `--smoke` shrinks every dimension (vocabulary 2048, hidden 128; 64 experts, top-6 kept) to check
that the script runs.

Usage: python benchmarks/real_shapes.py [--shape ernie-0.3b ernie-21b-a3b-scaled dense-135m] [--moe-layers 1]
       [--prompt 256] [--reps 10] [--generate 1 16] [--service] [--new-tokens 32] [--threads 1] [--smoke]
       [--precision float32 bfloat16 wint8 wint4]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.load import LoadMeter, load_line  # noqa: E402
from benchmarks.weight_read import weight_reader  # noqa: E402

SHAPES = {
    # ERNIE-4.5-0.3B's published config.json (baidu/ERNIE-4.5-0.3B-PT)
    "ernie-0.3b": dict(architectures=["Ernie4_5ForCausalLM"], model_type="ernie4_5", vocab_size=103424,
                       hidden_size=1024, intermediate_size=3072, num_hidden_layers=18, num_attention_heads=16,
                       num_key_value_heads=2, head_dim=128),
    # ERNIE-4.5-21B-A3B (transformers' defaults "similar to baidu/ERNIE-4.5-21B-A3B-PT"), 28 layers cut to
    # 1 dense + --moe-layers MoE layers
    "ernie-21b-a3b-scaled": dict(architectures=["Ernie4_5_MoeForCausalLM"], model_type="ernie4_5_moe",
                                 vocab_size=103424, hidden_size=2560, intermediate_size=12288, num_attention_heads=20,
                                 num_key_value_heads=4, head_dim=128, moe_num_experts=64, moe_k=6,
                                 moe_intermediate_size=1536, moe_num_shared_experts=2, moe_layer_start_index=1,
                                 moe_layer_end_index=-1, moe_layer_interval=1, moe_norm_min=1e-12,
                                 num_nextn_predict_layers=1),
    # the 135M-parameter dense shape of the issues' measurements (a Llama checkpoint: 30 layers, hidden 576)
    "dense-135m": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=49152, hidden_size=576,
                       intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                       head_dim=64, rope_theta=10000.0),
}
COMMON = dict(max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
              use_bias=False, hidden_act="silu", bos_token_id=1, eos_token_id=2, pad_token_id=0,
              torch_dtype="float32")
SMOKE = dict(vocab_size=2048, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, moe_intermediate_size=64)


def shape_config(name: str, moe_layers: int, smoke: bool) -> dict:
    config = {**COMMON, **SHAPES[name]}
    if "moe_num_experts" in config:
        config["num_hidden_layers"] = 1 + moe_layers
    if smoke:
        config.update({k: v for k, v in SMOKE.items() if k in config})
        config["num_hidden_layers"] = min(config["num_hidden_layers"], 2)
    return config


def tensor_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of the torch layout (transformers' names, [out, in]), MTP module included for the MoE."""
    h, hd = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd

    def block(p: str, moe: bool) -> dict:
        out = {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
               p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
               p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q)}
        if not moe:
            i = c["intermediate_size"]
            return {**out, p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                    p + "mlp.down_proj.weight": (h, i)}
        e, i, s = c["moe_num_experts"], c["moe_intermediate_size"], c["moe_num_shared_experts"]
        out.update({p + "mlp.gate.weight": (e, h), p + "mlp.moe_statics.e_score_correction_bias": (1, e)})
        for j in range(e):
            out.update({f"{p}mlp.experts.{j}.gate_proj.weight": (i, h), f"{p}mlp.experts.{j}.up_proj.weight": (i, h),
                        f"{p}mlp.experts.{j}.down_proj.weight": (h, i)})
        shared = p + "mlp.shared_experts."
        return {**out, shared + "gate_proj.weight": (i * s, h), shared + "up_proj.weight": (i * s, h),
                shared + "down_proj.weight": (h, i * s)}

    moe = "moe_num_experts" in c
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,)}
    for layer in range(c["num_hidden_layers"]):
        shapes.update(block(f"model.layers.{layer}.", moe and layer >= c.get("moe_layer_start_index", 1)))
    if moe:
        shapes.update({"model.mtp_emb_norm.0.weight": (h,), "model.mtp_hidden_norm.0.weight": (h,),
                       "model.mtp_linear_proj.0.weight": (h, 2 * h)})
        shapes.update(block("model.mtp_block.0.", False))
    return shapes


def write_checkpoint(directory: Path, config: dict, seed: int) -> None:
    """Random weights (norms 1 + N(0, 0.1), the rest N(0, 1/fan_in), embeddings N(0, 0.1)) in model.safetensors."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in tensor_shapes(config).items():
        if len(shape) == 1:
            t = 1.0 + 0.1 * rng.standard_normal(shape, np.float32)
        elif "correction_bias" in name:
            t = 0.01 * rng.standard_normal(shape, np.float32)
        else:
            std = 0.1 if "embed" in name else shape[1] ** -0.5
            t = std * rng.standard_normal(shape, np.float32)
        tensors[name] = t.astype(np.float32)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": config["eos_token_id"]}))
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, config["vocab_size"])}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
         "pad_token": "<pad>"}))


def checkpoint_of(shape: str, given: str | None, tmp: str, smoke: bool) -> str:
    """`given` (a checkpoint directory of the shape), else a one-layer-MoE checkpoint of `shape` written into
    tmp (seed 0)."""
    if given is not None:
        return given
    path = Path(tmp) / shape
    write_checkpoint(path, shape_config(shape, 1, smoke), 0)
    return str(path)


BATCH_ROWS = 16   # the "decode b=16" row: a decode step at C = 16

PRECISIONS = {"float32": ("float32", None), "bfloat16": ("bfloat16", None), "wint8": ("bfloat16", "wint8"),
              "wint4": ("bfloat16", "wint4")}


def stored_arrays(layer) -> list[np.ndarray]:
    """Every array a layer's weights are stored in (a Linear's packed weights and scales, other parameters)."""
    from fastdeploy.model_executor.layers.transformer import Linear
    arrays = []
    for sub in layer.sublayers(include_self=True):
        if isinstance(sub, Linear) and getattr(sub, "packed", None) is not None:
            arrays += [sub.packed.numpy()] + ([sub.scales.numpy()] if getattr(sub, "scales", None) is not None else [])
        else:
            arrays += [p.numpy() for p in sub.parameters(include_sublayers=False)]
    return arrays


def interleaved_ms(fns: dict, reps: int) -> dict:
    """The ms of each function per rep after one warm-up call (rope tables, allocator), run in turn rep by rep, so
    that a drift of the machine's speed during the measurement (±10 % here between runs) reaches each alike and
    the ratio of a rep's pair less."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            # GCC's OpenMP workers spin a while after a step's last parallel region: let them sleep, so that
            # they take no core from the next function (the read's threads)
            time.sleep(0.02)
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def median_ms(fn, reps: int) -> float:
    return statistics.median(interleaved_ms({"": fn}, reps)[""])


def active_fraction(model) -> float:
    """The fraction of the target's stored weight bytes one token reads: all but the embedding table (one row of
    it; a tied head is its own copy, read in full) and, on a MoE, the unrouted experts."""
    from fastdeploy.model_executor.layers.transformer import stored_weight_bytes
    total = stored_weight_bytes(model.net)
    embed = stored_weight_bytes(model.net.embed)
    moe = getattr(model, "moe", None)
    idle = 0
    if moe is not None:
        for i in model.moe_layer_ids:
            experts = model.net.layers[i].mlp
            per_expert = (stored_weight_bytes(experts.experts_up_gate) + stored_weight_bytes(experts.experts_down)) \
                / moe.num_experts
            idle += (moe.num_experts - moe.top_k) * per_expert
    return (total - idle - embed) / total


def arithmetic_bytes(config: dict, precision: str, layers: int | None = None) -> float:
    """Weight bytes from a config alone: embedding and norms / router unquantized (bf16, float32 for float32),
    each linear at its stored width (int4: half a byte), plus one float32 scale per output channel."""
    c = dict(config)
    if layers is not None:
        c["num_hidden_layers"] = layers
    h, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    dtype, quant = PRECISIONS[precision]
    unq = 4 if dtype == "float32" else 2
    dense_w = {None: unq, "wint8": 1, "wint4": 1 if "moe_num_experts" in c else 0.5}[quant]
    moe_w = {None: unq, "wint8": 1, "wint4": 0.5}[quant]

    def linear(k, m, width):
        return k * m * width + (4 * m if width < 2 else 0)
    attn = linear(h, q + 2 * kv, dense_w) + linear(q, h, dense_w)
    dense_mlp = linear(h, 2 * c["intermediate_size"], dense_w) + linear(c["intermediate_size"], h, dense_w)
    # the table and the head: a tied head is the table itself, held once, where its storage gives its columns
    # back (float32; bf16 in the CPU's own layout, not oneDNN's)
    from fastdeploy.model_executor.layers.quantization.base import CPU_KERNEL, KERNEL_DPBF16
    once = c.get("tie_word_embeddings") and (dtype == "float32" or CPU_KERNEL == KERNEL_DPBF16)
    total = (1 if once else 2) * v * h * unq
    for i in range(n):
        total += attn + 2 * h * 4
        if "moe_num_experts" in c and i >= 1:
            e, mi, s = c["moe_num_experts"], c["moe_intermediate_size"], c["moe_num_shared_experts"]
            total += e * (linear(h, 2 * mi, moe_w) + linear(mi, h, moe_w)) + e * h * 4 + e * 4
            total += linear(h, 2 * mi * s, dense_w) + linear(mi * s, h, dense_w)
        else:
            total += dense_mlp
    return total


def stored_mtp(model) -> int:
    from fastdeploy.model_executor.layers.transformer import stored_weight_bytes
    return 0 if getattr(model, "mtp", None) is None else stored_weight_bytes(model.mtp)


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def huge_pages_mib() -> float:
    """This process's memory in transparent huge pages (the packed weights ask for them)."""
    with open("/proc/self/smaps_rollup") as f:
        return next((int(line.split()[1]) / 1024 for line in f if line.startswith("AnonHugePages:")), 0.0)


def batch_decode(model, prompt_len: int, blocks: int, block: int, rng, count: int = BATCH_ROWS):
    """A decode step of `count` sequences, one token each at position `prompt_len`, each with its own context of
    `prompt_len` tokens in its own `blocks` blocks (random values written into the cache: a zero cache would read the
    kernel's shared zero page), and the cache it reads."""
    from fastdeploy.model_executor.models.base import ForwardBatch

    kv = model.new_kv_cache(count * blocks, block)
    for layer in range(len(kv.layers)):
        view = kv.host_view(layer)
        values = 0.1 * rng.standard_normal(view.shape, np.float32)
        view[...] = values if view.dtype == np.float32 else (values.view(np.uint32) >> 16).astype(view.dtype)
    tables = np.arange(count * blocks, dtype=np.int32).reshape(count, blocks)
    step = ForwardBatch(np.full(count, 5), np.full(count, prompt_len), np.arange(count + 1), tables)
    return kv, step


def step_times(model, prompt_len: int, reps: int, threads: int) -> tuple[dict, dict]:
    """The rows' median ms, and the ratios of the rows timed in turn (the median of each rep's ratio)."""
    import paddle
    from fastdeploy.model_executor.models.base import ForwardBatch

    block = 16
    blocks = -(-(prompt_len + 8) // block)
    kv = model.new_kv_cache(blocks, block)
    table = np.arange(blocks, dtype=np.int32)[None]
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, model.vocab_size, prompt_len)

    def batch(tokens, start):
        return ForwardBatch(np.asarray(tokens), np.arange(start, start + len(tokens)), [0, len(tokens)], table)

    last = np.array([prompt_len - 1])      # the engine's prefill asks the head for the last row only
    out = {"prefill": median_ms(lambda: model.forward(batch(prompt, 0), kv, last), max(1, reps // 4))}
    rows_kv, rows_batch = batch_decode(model, prompt_len, blocks, block, rng)
    paired = interleaved_ms({"decode b=1": lambda: model.forward(batch([5], prompt_len), kv),
                             "weights read once": weight_reader(stored_arrays(model.net), threads),
                             "verify b=1, K=1": lambda: model.forward(batch([5, 6], prompt_len), kv),
                             f"decode b={BATCH_ROWS}": lambda: model.forward(rows_batch, rows_kv)}, reps)
    out |= {name: statistics.median(t) for name, t in paired.items()}
    decode, read, verify, decode_rows = paired.values()
    fraction = active_fraction(model)
    out["active weights read"] = out["weights read once"] * fraction
    # the ratios of each rep's times, taken back to back, then their median: a drift between reps cancels
    ratios = {"decode / weights read": statistics.median(d / r for d, r in zip(decode, read))}
    ratios["decode / active read"] = ratios["decode / weights read"] / fraction
    ratios["verify / decode"] = statistics.median(v / d for v, d in zip(verify, decode))
    ratios[f"decode b={BATCH_ROWS} / read"] = statistics.median(d / r for d, r in zip(decode_rows, read))
    if model.num_mtp_layers:
        hidden = paddle.zeros([1, model.hidden_size], model.dtype)
        model.mtp_forward(batch(prompt[1:], 0), paddle.zeros([prompt_len - 1, model.hidden_size], model.dtype), kv,
                          last - 1)
        out["MTP b=1"] = median_ms(lambda: model.mtp_forward(batch([6], prompt_len - 1), hidden, kv), reps)
        out["round K=1"] = out["verify b=1, K=1"] + out["MTP b=1"]
        ratios["round K=1 / decode"] = out["round K=1"] / out["decode b=1"]
    return out, ratios


def engine_throughput(path: str, k: int, concurrency: int, prompt_len: int, new_tokens: int,
                      precision: str = "float32") -> float:
    from fastdeploy import LLM, SamplingParams
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    dtype, quantization = PRECISIONS[precision]
    llm = LLM(model=path, speculative_config=spec, max_num_seqs=concurrency, enable_prefix_caching=False,
              max_model_len=prompt_len + new_tokens + 16, dtype=dtype, quantization=quantization)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, llm.model.vocab_size, prompt_len).tolist() for _ in range(concurrency)]
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)   # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs.token_ids) for o in outs) / (time.perf_counter() - start)


def service_throughput(path: str, k: int, concurrency: int, prompt_len: int, new_tokens: int,
                       threads: int) -> float:
    """Output tokens/s of C clients, one /v1/completions request each (token-id prompts, min_tokens = max_tokens so
    every request emits new_tokens), against an API server on 127.0.0.1 started for the measurement."""
    import logging
    import socket
    import httpx
    from concurrent.futures import ThreadPoolExecutor

    logging.getLogger("httpx").setLevel(logging.WARNING)   # one line per request otherwise
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    flags = ["--model", path, "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", str(concurrency),
             "--max-model-len", str(prompt_len + new_tokens + 16), "--no-enable-prefix-caching"]
    if k:
        flags += ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": k})]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    server = subprocess.Popen([sys.executable, "-m", "fastdeploy.entrypoints.openai.api_server", *flags], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):   # the server loads the checkpoint: up to 10 minutes for the full shapes
            if server.poll() is not None:
                raise RuntimeError(f"the API server exited with status {server.returncode}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        rng = np.random.default_rng(1)
        model = Path(path).name
        bodies = [{"model": model, "prompt": rng.integers(3, 100, prompt_len).tolist(), "max_tokens": new_tokens,
                   "min_tokens": new_tokens, "temperature": 0} for _ in range(concurrency)]

        def send(body):
            answer = httpx.post(url + "/v1/completions", json=body, timeout=3600).json()
            return answer["usage"]["completion_tokens"]

        send({**bodies[0], "max_tokens": 2, "min_tokens": 2})   # warm-up
        with ThreadPoolExecutor(concurrency) as pool:
            start = time.perf_counter()
            tokens = sum(pool.map(send, bodies))
        return tokens / (time.perf_counter() - start)
    finally:
        server.terminate()
        server.wait(60)


TRANSFORMERS_GENERATE = r"""
import json, sys, time, torch
from transformers import AutoModelForCausalLM
req = json.load(sys.stdin)
torch.set_num_threads(req["threads"])
model = AutoModelForCausalLM.from_pretrained(req["path"], dtype=torch.float32).eval()
ids = torch.randint(3, model.config.vocab_size, (req["concurrency"], req["prompt_len"]),
                    generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    model.generate(ids[:1], max_new_tokens=2, min_new_tokens=2, do_sample=False)
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=req["new_tokens"], min_new_tokens=req["new_tokens"], do_sample=False)
    elapsed = time.perf_counter() - start
print(json.dumps({"tokens_per_s": (out.shape[1] - ids.shape[1]) * ids.shape[0] / elapsed}))
"""


def transformers_throughput(path: str, concurrency: int, prompt_len: int, new_tokens: int, threads: int) -> float:
    req = dict(path=path, concurrency=concurrency, prompt_len=prompt_len, new_tokens=new_tokens, threads=threads)
    done = subprocess.run([sys.executable, "-c", TRANSFORMERS_GENERATE], input=json.dumps(req), text=True,
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"transformers generate failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)["tokens_per_s"]


def passthrough(argv: list[str]) -> list[str]:
    """The options a per-precision child repeats: all but --shape, --precision, --generate and --service (each
    with its values)."""
    out, skip = [], False
    for arg in argv:
        if arg.startswith("--"):
            skip = arg in ("--shape", "--precision", "--generate", "--service", "--checkpoint")
        if not skip:
            out.append(arg)
    return out


def pass_times(name: str, path: str, config: dict, precision: str, args, get_model, speculative_config) -> None:
    """Load the checkpoint in one precision and print its section: stored and resident weights, step times."""
    moe = "moe_num_experts" in config
    dtype, quantization = PRECISIONS[precision]

    def load(directory):
        return get_model(directory, speculative=speculative_config("mtp", 1) if moe else None, dtype=dtype,
                         quantization=quantization)

    # A smoke-sized model of the family first, so the code a load runs (Paddle's kernels, the CPU linear ops) is
    # resident before the measurement and the growth is the model's
    with tempfile.TemporaryDirectory(prefix="fd-warm-up-") as tmp:
        write_checkpoint(Path(tmp), shape_config(name, 1, smoke=True), args.seed)
        load(tmp)
    trim = ctypes.CDLL("libc.so.6").malloc_trim   # freed float32 temporaries of a load, back to the system
    trim(0)
    before, huge_before = resident_mib(), huge_pages_mib()
    model = load(path)
    trim(0)
    loaded, huge = resident_mib() - before, huge_pages_mib() - huge_before
    print(f"\n== {name}{' (smoke)' if args.smoke else ''}: {config['num_hidden_layers']} layers, "
          f"{precision}, {args.threads} thread(s), context {args.prompt}")
    arithmetic = arithmetic_bytes(config, precision) / 2 ** 20
    stored = model.weight_bytes() / 2 ** 20
    print(f"{'target weights':<22}{stored - stored_mtp(model) / 2 ** 20:10.1f} MiB stored "
          f"({arithmetic:.1f} MiB arithmetic)")
    print(f"{'resident growth':<22}{loaded:10.1f} MiB loading the model (MTP module included: {stored:.1f} MiB "
          f"stored; {loaded / stored:.3f} x)")
    print(f"{'in huge pages':<22}{huge:10.1f} MiB of that growth (transparent huge pages)")
    if moe and not args.smoke:
        full = arithmetic_bytes(config, precision, layers=28) / 2 ** 30
        print(f"{'21B-A3B, 28 layers':<22}{full:10.1f} GiB of weights (arithmetic)")
    times, ratios = step_times(model, args.prompt, args.reps, args.threads)
    for row, ms in times.items():
        print(f"{row:<22}{ms:10.2f} ms")
    for row, ratio in ratios.items():
        print(f"{row:<22}{ratio:10.2f} x")
    sys.stdout.flush()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--moe-layers", type=int, default=1, help="MoE layers after the dense layer 0 (21B: 27)")
    parser.add_argument("--prompt", type=int, default=256, help="prompt / context length (tokens)")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--generate", type=int, nargs="*", default=[], metavar="C",
                        help="also measure throughput at these concurrencies (engine K=0, K=1, transformers)")
    parser.add_argument("--service", action="store_true", help="with --generate: also through the HTTP service")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for both engines (OMP_NUM_THREADS)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny dimensions: check that the script runs")
    parser.add_argument("--precision", nargs="+", choices=list(PRECISIONS), default=["float32"])
    parser.add_argument("--checkpoint", help="measure this checkpoint directory of the --shape (skip writing one)")
    args = parser.parse_args(argv)
    if args.moe_layers < 1 or args.prompt < 2 or args.reps < 1:
        parser.error("--moe-layers and --reps must be >= 1, --prompt >= 2")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from fastdeploy.config import SpeculativeConfig
    from fastdeploy.model_executor.models import get_model

    meter = LoadMeter()
    meter.start()
    for name in args.shape:
        config = shape_config(name, args.moe_layers, args.smoke)
        with tempfile.TemporaryDirectory(prefix=f"fd-{name}-") as tmp:
            path = args.checkpoint or str(Path(tmp) / name)
            if not args.checkpoint:
                write_checkpoint(Path(path), config, args.seed)
            moe = "moe_num_experts" in config
            for precision in args.precision:
                if len(args.precision) > 1:   # each precision in a fresh process: its resident growth is its own
                    sys.stdout.flush()
                    child = passthrough(argv if argv is not None else sys.argv[1:])
                    subprocess.run([sys.executable, __file__, *child, "--shape", name,
                                    "--checkpoint", path, "--precision", precision, "--generate"], check=True)
                else:
                    pass_times(name, path, config, precision, args, get_model, SpeculativeConfig)
            for c in args.generate:
                row = [f"C={c}"]
                for k in ((0, 1) if moe else (0,)):
                    for precision in args.precision:
                        tps = engine_throughput(path, k, c, args.prompt, args.new_tokens, precision)
                        row.append(f"engine {precision} K={k} {tps:.1f} tok/s")
                    if args.service:
                        tps = service_throughput(path, k, c, args.prompt, args.new_tokens, args.threads)
                        row.append(f"service K={k} {tps:.1f} tok/s")
                reference = transformers_throughput(path, c, args.prompt, args.new_tokens, args.threads)
                row.append(f"transformers {reference:.1f} tok/s")
                print("  ".join(row))
    print(load_line(meter.stop()))


if __name__ == "__main__":
    main()
