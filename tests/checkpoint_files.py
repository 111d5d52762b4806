"""Tiny random checkpoints in the published layouts, written by the tests (no download; docs/testing.md
"Checkpoint oracle").

- torch layout: transformers' own classes write it (tests/reference/hf_oracle.py, in a subprocess: never torch in
  this process): `model.` prefix, separate q/k/v and gate/up, `[out, in]`, config.json with `torch_dtype`.
- Paddle layout: the same tensors rewritten here with NumPy + safetensors as FastDeploy's Paddle checkpoints lay
  them out: `ernie.` prefix, fused `qkv_proj` ([q | k | v]) and `up_gate_proj` ([gate | up]), `[in, out]`,
  config.json with `dtype` instead of `torch_dtype`.
Both single-file and sharded (`model.safetensors.index.json`). `oracle_generate` runs the transformers model of
a torch-layout directory greedily: the independent result the engine is compared with.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ORACLE = Path(__file__).resolve().parent / "reference" / "hf_oracle.py"
# Shapes small enough for a test, with GQA (2 query heads per KV head) and head_dim != hidden / heads for Qwen3.
ERNIE_SHAPE = dict(vocab_size=384, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                   rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, use_bias=False,
                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
QWEN3_SHAPE = dict(vocab_size=384, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                   rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False,
                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
INIT_STD = 0.25   # weights ~ N(0, 0.25): logits spread enough that greedy text varies and top-2 ties are rare


def reference_missing() -> str | None:
    """Why the oracle cannot run here (a pytest skip reason), or None."""
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    return (f"the transformers oracle needs {' and '.join(missing)} (pip install '.[reference]')"
            if missing else None)


def run_oracle(jobs: list[dict], timeout: float = 300) -> list[dict]:
    """Run jobs in one oracle subprocess (importing torch costs seconds: batch them)."""
    done = subprocess.run([sys.executable, str(ORACLE)], input=json.dumps(jobs), capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"hf_oracle failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout)


def oracle_generate(directory: str | Path, prompts: list[list[int]], max_new_tokens: int,
                    dtype: str = "float64") -> list[dict]:
    return run_oracle([{"job": "generate", "directory": str(directory), "prompts": prompts,
                        "max_new_tokens": max_new_tokens, "dtype": dtype}])[0]["results"]


def write_job(architecture: str, directory: str | Path, seed: int = 0, sharded: bool = False,
              save_dtype: str = "float32", published_config: bool = True, **overrides) -> dict:
    """The oracle job that writes one torch-layout checkpoint (for batching several in one run_oracle);
    published_config False keeps config.json exactly as transformers' save_pretrained writes it (`dtype`,
    `rope_parameters`), not the released checkpoints' form."""
    shape = dict(ERNIE_SHAPE if architecture == "Ernie4_5ForCausalLM" else QWEN3_SHAPE)
    shape.update(overrides)
    return {"job": "write", "architecture": architecture, "directory": str(directory), "config": shape,
            "seed": seed, "init_std": INIT_STD, "save_dtype": save_dtype, "published_config": published_config,
            "max_shard_size": "40KB" if sharded else None}


def write_tokenizer(directory: Path, architecture: str, vocab_size: int) -> int:
    """The tokenizer files the family ships (tests/tokenizer_files.py): ERNIE's sentencepiece model, or a
    tokenizer.json; returns the vocabulary size, which the model's vocab_size must cover."""
    from tests import tokenizer_files
    if architecture.startswith("Ernie"):
        return tokenizer_files.write_ernie_tokenizer(directory, vocab_size=vocab_size)
    return tokenizer_files.write_hf_tokenizer(directory, vocab_size=vocab_size)


def _write(architecture: str, directory: str | Path, layout: str, seed: int, sharded: bool, tokenizer: bool,
           save_dtype: str, **overrides) -> Path:
    directory = Path(directory)
    if layout not in ("torch", "paddle"):
        raise ValueError(f"layout must be 'torch' or 'paddle', got {layout!r}")
    torch_dir = directory if layout == "torch" else directory.with_name(directory.name + ".torch")
    if tokenizer:   # a trained vocabulary may come out smaller than asked: the model covers what it has
        shape = ERNIE_SHAPE if architecture == "Ernie4_5ForCausalLM" else QWEN3_SHAPE
        size = write_tokenizer(directory, architecture, overrides.get("vocab_size", shape["vocab_size"]))
        overrides = {**overrides, "vocab_size": max(size, overrides.get("vocab_size", 0))}
    run_oracle([write_job(architecture, torch_dir, seed, sharded and layout == "torch", save_dtype, **overrides)])
    if layout == "paddle":
        to_paddle_layout(torch_dir, directory, sharded=sharded)
        shutil.rmtree(torch_dir)
    return directory


def write_ernie4_5_checkpoint(directory, layout: str = "torch", seed: int = 0, sharded: bool = False,
                              tokenizer: bool = True, save_dtype: str = "float32", **overrides) -> Path:
    """A tiny random ERNIE-4.5 dense checkpoint in `directory` (ERNIE_SHAPE with `overrides`)."""
    return _write("Ernie4_5ForCausalLM", directory, layout, seed, sharded, tokenizer, save_dtype, **overrides)


def write_qwen3_checkpoint(directory, layout: str = "torch", seed: int = 0, sharded: bool = False,
                           tokenizer: bool = True, save_dtype: str = "float32", **overrides) -> Path:
    """A tiny random Qwen3 dense checkpoint in `directory` (QWEN3_SHAPE with `overrides`)."""
    return _write("Qwen3ForCausalLM", directory, layout, seed, sharded, tokenizer, save_dtype, **overrides)


def read_tensors(directory: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a float32/float64 checkpoint directory, by name."""
    from safetensors.numpy import load_file
    tensors: dict[str, np.ndarray] = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def write_tensors(directory: Path, tensors: dict[str, np.ndarray], sharded: bool) -> None:
    """model.safetensors, or two shards and model.safetensors.index.json."""
    from safetensors.numpy import save_file
    if not sharded:
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "np"})
        return
    names = sorted(tensors)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(halves):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(directory / file), metadata={"format": "np"})
        weight_map.update({n: file for n in part})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
                    "weight_map": weight_map}, indent=2))


def to_paddle_layout(torch_dir: Path, paddle_dir: Path, sharded: bool = False) -> None:
    """Rewrite a torch-layout checkpoint as FastDeploy's Paddle layout (see the module docstring)."""
    paddle_dir.mkdir(parents=True, exist_ok=True)
    config = json.loads((torch_dir / "config.json").read_text())
    config["dtype"] = config.pop("torch_dtype", config.get("dtype"))
    tensors = read_tensors(torch_dir)
    out: dict[str, np.ndarray] = {}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        qkv = [tensors.pop(f"{p}self_attn.{n}_proj.weight") for n in "qkv"]
        out[f"{p}self_attn.qkv_proj.weight"] = np.ascontiguousarray(np.concatenate(qkv, axis=0).T)
        gate_up = [tensors.pop(f"{p}mlp.{n}_proj.weight") for n in ("gate", "up")]
        out[f"{p}mlp.up_gate_proj.weight"] = np.ascontiguousarray(np.concatenate(gate_up, axis=0).T)
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            out[p + name] = np.ascontiguousarray(tensors.pop(p + name).T)
    if "lm_head.weight" in tensors:
        out["lm_head.weight"] = np.ascontiguousarray(tensors.pop("lm_head.weight").T)
    out.update(tensors)   # embeddings ([vocab, hidden] in both layouts) and the norms
    out = {("ernie." + n[len("model."):] if n.startswith("model.") else n): t for n, t in out.items()}
    write_tensors(paddle_dir, out, sharded)
    (paddle_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if (torch_dir / "generation_config.json").is_file():
        shutil.copy(torch_dir / "generation_config.json", paddle_dir / "generation_config.json")


def write_numpy_checkpoint(directory: str | Path, architecture: str = "Ernie4_5ForCausalLM", seed: int = 0,
                           tokenizer: bool = False, **overrides) -> Path:
    """A random torch-layout checkpoint written with NumPy alone (the tensor names and shapes transformers
    writes), for tests that need no oracle (bad checkpoints, configuration): runs where torch is absent."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = dict(ERNIE_SHAPE if architecture == "Ernie4_5ForCausalLM" else QWEN3_SHAPE)
    if tokenizer:
        config["vocab_size"] = max(config["vocab_size"], write_tokenizer(directory, architecture,
                                                                         config["vocab_size"]))
    config.update(overrides)
    config.update(architectures=[architecture], torch_dtype="float32", hidden_act="silu",
                  model_type="ernie4_5" if architecture == "Ernie4_5ForCausalLM" else "qwen3")
    rng = np.random.default_rng(seed)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d, nq, nkv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]

    def rand(*shape):
        return (rng.standard_normal(shape) * INIT_STD).astype(np.float32)

    tensors = {"model.embed_tokens.weight": rand(v, h), "model.norm.weight": 1 + rand(h)}
    if not config["tie_word_embeddings"]:
        tensors["lm_head.weight"] = rand(v, h)
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        tensors.update({p + "input_layernorm.weight": 1 + rand(h), p + "post_attention_layernorm.weight": 1 + rand(h),
                        p + "self_attn.q_proj.weight": rand(nq * d, h), p + "self_attn.k_proj.weight": rand(nkv * d, h),
                        p + "self_attn.v_proj.weight": rand(nkv * d, h), p + "self_attn.o_proj.weight": rand(h, nq * d),
                        p + "mlp.gate_proj.weight": rand(i, h), p + "mlp.up_proj.weight": rand(i, h),
                        p + "mlp.down_proj.weight": rand(h, i)})
        if architecture == "Qwen3ForCausalLM":
            tensors.update({p + "self_attn.q_norm.weight": 1 + rand(d), p + "self_attn.k_norm.weight": 1 + rand(d)})
    write_tensors(directory, tensors, sharded=False)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": config["eos_token_id"]}) + "\n")
    return directory



def halve_a_tensor_between_samples(file: Path) -> str:
    """Halve, in place, one float32 tensor of the safetensors `file` that lies wholly between the 64 KiB windows
    (start, middle) round 5's checkpoint identity sampled (every other byte, and the size, unchanged); its name."""
    sample = 1 << 16
    raw = Path(file).read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])
    base, size = 8 + header_len, len(raw)
    for name, entry in header.items():
        if name == "__metadata__" or entry["dtype"] != "F32":
            continue
        start, end = (base + offset for offset in entry["data_offsets"])
        if start >= sample and end <= size // 2 - sample // 2 and end - start >= 4096:
            halved = np.frombuffer(raw[start:end], np.float32) * np.float32(0.5)
            with open(file, "r+b") as handle:
                handle.seek(start)
                handle.write(halved.tobytes())
            return name
    raise AssertionError(f"no float32 tensor between the samples of {file}")

# ---- ERNIE-4.5 MoE + MTP ----

MOE_TORCH = Path(__file__).resolve().parent / "reference" / "ernie4_5_moe_torch.py"
# 4 layers: dense layer 0, MoE layers 1-3 (interval 1), 8 experts of which 3 per token, 2 shared, GQA 2:1
ERNIE_MOE_SHAPE = dict(vocab_size=384, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                       rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, use_bias=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0, moe_num_experts=8, moe_k=3,
                       moe_intermediate_size=32, moe_num_shared_experts=2, moe_layer_start_index=1,
                       moe_layer_end_index=3, moe_layer_interval=1, moe_norm_min=1e-12)


def run_moe_reference(request: dict, timeout: float = 300) -> dict:
    """One request to tests/reference/ernie4_5_moe_torch.py in its own process (torch never in this one)."""
    done = subprocess.run([sys.executable, str(MOE_TORCH)], input=json.dumps(request), capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"ernie4_5_moe_torch {request['command']} failed ({done.returncode}): "
                           f"{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def write_ernie4_5_moe_checkpoint(directory, layout: str = "torch", seed: int = 0, mtp: str = "inline",
                                  tokenizer: bool = True, mtp_noise: float = 0.05, **overrides) -> dict:
    """A tiny random ERNIE-4.5 MoE checkpoint with an MTP module in `directory` (ERNIE_MOE_SHAPE + overrides).

    transformers writes the target (`save_pretrained`, torch layout) in the reference subprocess, which adds the MTP
    tensors under the published names and fits the MTP projection so that its drafts agree with the target often
    but not always (tests/reference/ernie4_5_moe_torch.py). `mtp`: "inline" (in model.safetensors), "separate"
    (in `<directory>/mtp`, the --speculative-config "model" form) or "none". `layout` "paddle" rewrites every file
    as FastDeploy's Paddle layout (paddle_tensors). Returns the writer's report: "mtp_agreement" (held-out greedy
    agreement of the fitted MTP with the target), "mtp_directory", "torch_directory" (the torch-layout twin the
    reference reads; the directory itself for layout "torch")."""
    if layout not in ("torch", "paddle"):
        raise ValueError(f"layout must be 'torch' or 'paddle', got {layout!r}")
    if mtp not in ("inline", "separate", "none"):
        raise ValueError(f"mtp must be 'inline', 'separate' or 'none', got {mtp!r}")
    directory = Path(directory)
    torch_dir = directory if layout == "torch" else directory.with_name(directory.name + ".torch")
    shape = {**ERNIE_MOE_SHAPE, **overrides}
    if tokenizer:   # first: the model's vocabulary covers what the trained tokenizer has
        for target in {directory, torch_dir}:    # the torch twin serves too (it is the same model)
            size = write_tokenizer(target, "Ernie4_5_MoeForCausalLM", shape["vocab_size"])
        shape["vocab_size"] = max(size, shape["vocab_size"])
    report = run_moe_reference({"command": "write", "directory": str(torch_dir), "config": shape, "seed": seed,
                                "mtp_fit": mtp != "none", "with_mtp": mtp != "none", "mtp_noise": mtp_noise,
                                "mtp_directory": str(torch_dir / "mtp") if mtp == "separate" else None})
    if layout == "paddle":
        _moe_to_paddle(torch_dir, directory)
        if mtp == "separate":
            _moe_to_paddle(torch_dir / "mtp", directory / "mtp")
    report.update(torch_directory=str(torch_dir),
                  mtp_directory=str(directory / "mtp") if mtp == "separate" else None)
    return report


def paddle_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Torch-layout tensors as FastDeploy's Paddle layout: `ernie.` prefix, q/k/v fused as `qkv_proj` and
    gate/up as `up_gate_proj` wherever they occur (attention, dense MLP, each expert, the shared experts, the MTP
    block), every linear weight (`*_proj`, the router `mlp.gate`, `lm_head`) as [in, out]; embeddings, norms and
    the correction bias as they are."""
    tensors = dict(tensors)
    out: dict[str, np.ndarray] = {}
    for name in sorted(tensors):
        if name.endswith("self_attn.q_proj.weight"):
            p = name[:-len("q_proj.weight")]
            qkv = [tensors.pop(f"{p}{n}_proj.weight") for n in "qkv"]
            out[p + "qkv_proj.weight"] = np.ascontiguousarray(np.concatenate(qkv, axis=0).T)
        elif name.endswith("gate_proj.weight") and name in tensors:
            p = name[:-len("gate_proj.weight")]
            gate_up = [tensors.pop(p + "gate_proj.weight"), tensors.pop(p + "up_proj.weight")]
            out[p + "up_gate_proj.weight"] = np.ascontiguousarray(np.concatenate(gate_up, axis=0).T)
    for name, t in tensors.items():
        linear = t.ndim == 2 and (name.endswith("_proj.weight") or name.endswith("mlp.gate.weight")
                                  or name.endswith("linear_proj.0.weight") or name == "lm_head.weight")
        out[name] = np.ascontiguousarray(t.T) if linear else t
    return {("ernie." + n[len("model."):] if n.startswith("model.") else n): t for n, t in out.items()}


def _moe_to_paddle(torch_dir: Path, paddle_dir: Path) -> None:
    paddle_dir.mkdir(parents=True, exist_ok=True)
    config = json.loads((torch_dir / "config.json").read_text())
    config["dtype"] = config.pop("torch_dtype")
    write_tensors(paddle_dir, paddle_tensors(read_tensors(torch_dir)), sharded=False)
    (paddle_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if (torch_dir / "generation_config.json").is_file():
        shutil.copy(torch_dir / "generation_config.json", paddle_dir / "generation_config.json")


def moe_reference(command: str, torch_directory, mtp_directory=None, **fields) -> dict:
    """generate / mtp_logits of the torch reference on a torch-layout directory (float64 by default)."""
    return run_moe_reference({"command": command, "directory": str(torch_directory),
                              "mtp_directory": None if mtp_directory is None else str(mtp_directory), **fields})
