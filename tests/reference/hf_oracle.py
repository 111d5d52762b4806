"""The independent implementation the checkpoint models are judged against: transformers' own model classes on
CPU torch (docs/testing.md "Checkpoint oracle").

Run ONLY as a subprocess (`python -m tests.reference.hf_oracle`, JSON jobs on stdin, JSON results on stdout):
the test process imports Paddle, and torch/transformers must never share a process with it. The served package
never imports this. Jobs:

- {"job": "write", "architecture": a transformers class such as "Ernie4_5ForCausalLM", "directory": D, "config": {...},
   "seed": S, "init_std": X, "save_dtype": "float32" | "bfloat16", "max_shard_size": null | "20KB"}
  builds a randomly initialised model of that class (weights ~ N(0, init_std), norm weights 1 + N(0, 0.2):
  tiny default init gives near-uniform logits and degenerate greedy text) and writes it with save_pretrained
  (the published torch layout: `model.` prefix, `[out, in]`), then rewrites config.json into the released
  checkpoints' form (`torch_dtype`, top-level `rope_theta`; transformers 5 writes `dtype` / `rope_parameters`),
  unless "published_config" is false (the form today's transformers saves, which the engine must read too).
- {"job": "generate", "directory": D, "prompts": [[ids]], "max_new_tokens": N, "dtype": "float64"}
  loads D with `AutoModelForCausalLM.from_pretrained` and decodes greedily without stopping at EOS; per prompt:
  "tokens", "logprobs" (log_softmax of the chosen token), "margins" (top-1 minus top-2 logit) and "top_ids" (the
  5 most likely ids) per step. "dtype" may be "bfloat16" (the precision oracle, tests/models/test_precision_oracle.py).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _published_config(directory: Path) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    if "dtype" in config:
        config["torch_dtype"] = config.pop("dtype")
    rope = config.pop("rope_parameters", None)
    if rope is not None:
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"hf_oracle: rope_type {rope['rope_type']!r} has no published plain form")
        config["rope_theta"] = rope["rope_theta"]
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write(job: dict) -> dict:
    import torch
    import transformers

    torch.manual_seed(int(job["seed"]))
    arch = job["architecture"]
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))   # Qwen3ForCausalLM -> Qwen3Config
    config = config_cls(**job["config"])
    model = getattr(transformers, arch)(config)
    std = float(job.get("init_std", 0.02))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, std)
    if job.get("save_dtype", "float32") == "bfloat16":
        model = model.to(torch.bfloat16)
    directory = Path(job["directory"])
    kwargs = {"max_shard_size": job["max_shard_size"]} if job.get("max_shard_size") else {}
    model.save_pretrained(directory, **kwargs)
    if job.get("published_config", True):
        _published_config(directory)
    return {"directory": str(directory), "files": sorted(p.name for p in directory.iterdir())}


def generate(job: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, job.get("dtype", "float64"))
    model = AutoModelForCausalLM.from_pretrained(job["directory"], dtype=dtype)
    model.eval()
    results = []
    with torch.no_grad():
        for prompt in job["prompts"]:
            ids = list(prompt)
            tokens, logprobs, margins, top_ids = [], [], [], []
            for _ in range(int(job["max_new_tokens"])):
                logits = model(torch.tensor([ids])).logits[0, -1].to(torch.float64)
                top = torch.topk(logits, 2)
                token = int(top.indices[0])
                tokens.append(token)
                logprobs.append(float(torch.log_softmax(logits, -1)[token]))
                margins.append(float(top.values[0] - top.values[1]))
                top_ids.append(torch.topk(logits, 5).indices.tolist())
                ids.append(token)
            results.append({"tokens": tokens, "logprobs": logprobs, "margins": margins, "top_ids": top_ids})
    return {"results": results}


def main() -> None:
    jobs = json.load(sys.stdin)
    out = [{"write": write, "generate": generate}[job["job"]](job) for job in jobs]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
