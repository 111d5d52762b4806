"""The reference side of tests/models/test_sampling_distribution.py: the distribution each emitted position is drawn
from, by transformers' own logits processors over transformers' `Ernie4_5_MoeForCausalLM` logits (float64).

Run ONLY as a subprocess (`python tests/reference/sampling_distribution.py < request.json`): torch must never share a
process with paddle. Request: {"directory": a torch-layout checkpoint, "cases": [{"prompt": [ids], "tokens": [the
engine's emitted ids], "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
"presence_penalty"}]}. Answer: {"engine_order": [[probs [V] per position] per case], "generate_order": [...]}.

Position i is sampled after prompt + tokens[:i]; its logits are the model's at that prefix's last position. Then:
RepetitionPenaltyLogitsProcessor over prompt + tokens[:i]; vLLM's documented frequency / presence formula (logits
minus f x count and p x [count > 0], counts over tokens[:i] only; transformers has no such processor);
temperature 0: one-hot at the argmax; else TemperatureLogitsWarper and the warpers in the engine's order (MinP,
TopK, TopP: vLLM v1's) for "engine_order", and in transformers' generate order (TopK, TopP, MinP) for
"generate_order" (docs/serving.md "Sampling controls": they differ only when min_p and top_p < 1 are both set).
"""
from __future__ import annotations

import json
import sys

import torch
from transformers import Ernie4_5_MoeForCausalLM
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)


def warpers(case: dict, order: str) -> list:
    temperature = TemperatureLogitsWarper(case["temperature"])
    min_p = [MinPLogitsWarper(case["min_p"])] if case["min_p"] > 0 else []
    top_k = [TopKLogitsWarper(case["top_k"])] if case["top_k"] > 0 else []
    top_p = [TopPLogitsWarper(case["top_p"])] if case["top_p"] < 1 else []
    return [temperature, *min_p, *top_k, *top_p] if order == "engine" else [temperature, *top_k, *top_p, *min_p]


@torch.no_grad()
def distributions(model, case: dict, order: str, logits: torch.Tensor) -> list[list[float]]:
    prompt, tokens = case["prompt"], case["tokens"]
    out = []
    for i in range(len(tokens)):
        context = torch.tensor([prompt + tokens[:i]])
        scores = logits[len(prompt) - 1 + i][None].clone()
        if case["repetition_penalty"] != 1.0:
            scores = RepetitionPenaltyLogitsProcessor(case["repetition_penalty"])(context, scores)
        counts = torch.bincount(torch.tensor(tokens[:i], dtype=torch.long), minlength=scores.shape[-1])
        scores = scores - case["frequency_penalty"] * counts - case["presence_penalty"] * (counts > 0)
        if case["temperature"] == 0.0:
            probs = torch.zeros_like(scores)
            probs[0, int(scores.argmax())] = 1.0
        else:
            for warper in warpers(case, order):
                scores = warper(context, scores)
            probs = torch.softmax(scores, dim=-1)
        out.append(probs[0].tolist())
    return out


def main() -> None:
    req = json.load(sys.stdin)
    model = Ernie4_5_MoeForCausalLM.from_pretrained(req["directory"], attn_implementation="eager",
                                                    experts_implementation="eager").eval().double()
    answer = {"engine_order": [], "generate_order": []}
    for case in req["cases"]:
        with torch.no_grad():
            logits = model(torch.tensor([case["prompt"] + case["tokens"]])).logits[0].double()
        for order in ("engine", "generate"):
            answer[order + "_order"].append(distributions(model, case, order, logits))
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
