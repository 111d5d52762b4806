"""Seeded request mixes for the end-to-end oracles (PD_MTP_FLOW §10) and helpers to run them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.entrypoints.llm import LLM
from fastdeploy.model_executor.models import get_model

# Small blocks and a small per-step token budget: long prompts are prefilled in several chunks and decode
# lookahead crosses block boundaries often.
TOY_ENGINE = dict(model="fd-toy", max_num_seqs=8, block_size=4, max_model_len=128, max_num_batched_tokens=16)


@dataclass(frozen=True)
class Case:
    name: str
    prompt: list[int]
    params: SamplingParams


def toy_workload(seed: int) -> list[Case]:
    """>= 50 fd-toy requests: EOS at many output positions, max_tokens 1 and 2, min_tokens beyond the natural
    EOS, stop sequences built from the model's frequent tokens, long prompts that need chunked prefill."""
    model = get_model("fd-toy")
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(16):
        prompt = model.find_prompt(eos_index=i, prompt_len=int(rng.integers(2, 20)), seed=seed * 100 + i)
        cases.append(Case(f"eos_at_{i}", prompt, SamplingParams(max_tokens=24)))
    for i, max_tokens in enumerate((1, 1, 1, 2, 2, 2)):
        prompt = model.find_prompt(eos_index=i % 3, prompt_len=int(rng.integers(2, 12)), seed=seed * 100 + 20 + i)
        cases.append(Case(f"max_tokens_{max_tokens}_eos_{i % 3}", prompt, SamplingParams(max_tokens=max_tokens)))
    for i in range(6):
        eos = 1 + i
        prompt = model.find_prompt(eos_index=eos, prompt_len=int(rng.integers(2, 12)), seed=seed * 100 + 30 + i)
        cases.append(Case(f"min_tokens_over_eos_{eos}", prompt, SamplingParams(max_tokens=20, min_tokens=eos + 3)))
    stops = (["e "], [" a"], ["ea", "a "], ["e"], [" "], ["ae", "  "], ["a"], ["e a"], ["ee"], [" e"])
    for i, stop in enumerate(stops):
        prompt = [256, *rng.integers(32, 127, int(rng.integers(2, 16))).tolist()]
        cases.append(Case(f"stop_{'|'.join(stop)}", prompt, SamplingParams(max_tokens=30, stop=stop,
                                                                           min_tokens=int(i % 3))))
    for i in range(6):
        prompt = [256, *rng.integers(32, 127, int(rng.integers(40, 80))).tolist()]
        cases.append(Case(f"long_prompt_{len(prompt)}", prompt, SamplingParams(max_tokens=int(rng.integers(5, 30)))))
    for i in range(8):
        prompt = [256, *rng.integers(32, 127, int(rng.integers(1, 30))).tolist()]
        cases.append(Case(f"random_{i}", prompt, SamplingParams(max_tokens=30)))
    return cases


def run(cases: list[Case], k: int, **engine) -> list:
    """Outputs of every case on a fresh single instance with MTP K (0 = no speculation)."""
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    llm = LLM(speculative_config=spec, **{**TOY_ENGINE, **engine})
    attach = getattr(engine.get("trace_hook"), "attach", None)   # a TraceChecker also checks the runner's state
    if attach is not None:
        attach(llm.engine.runner)
    outputs = llm.generate([c.prompt for c in cases], [c.params for c in cases])
    stats = llm.resource_stats()
    assert (stats.free_slots, stats.free_kv_blocks, stats.running_requests) == \
        (stats.total_slots, stats.total_kv_blocks, 0), f"resources not released after the workload: {stats}"
    assert not llm.engine.anomalies
    return outputs


def assert_same_outputs(cases: list[Case], expected: list, actual: list) -> None:
    for case, want, got in zip(cases, expected, actual):
        assert got.error is None, f"{case.name}: {got.error}"
        assert (got.outputs.token_ids, got.outputs.finish_reason) == \
            (want.outputs.token_ids, want.outputs.finish_reason), case.name
