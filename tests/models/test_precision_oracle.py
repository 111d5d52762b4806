"""Reduced precisions against transformers (docs/testing.md "Precision oracle"), on a tiny random ERNIE-4.5 dense
checkpoint written by transformers:

- bfloat16: the engine (weights bf16, activations float32 rounded to bf16 at each linear) against transformers
  running the same checkpoint in bfloat16 (everything bf16);
- wint8 / wint4: the engine quantizing at load against transformers in float64 on a copy of the checkpoint whose
  weights are the ones the engine multiplies (each linear dequantized by the NumPy reference, the embedding and
  head rounded to bf16).

Compared as vLLM's `check_logprobs_close` compares: greedy tokens equal until the first difference, and there each
side's token among the other's top 5; the log probabilities of the equal prefix within LOGPROB_TOL. 8 prompts x
32 tokens, single instance and in-process PD (whose tokens and logprobs must equal the single instance's exactly).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.layers.quantization.weight_only import dequantize, quantize, round_to_bf16
from tests.checkpoint_files import read_tensors, reference_missing, run_oracle, write_job, write_tensors, write_tokenizer
from tests.models.test_checkpoint_oracle import _prompts

pytestmark = pytest.mark.skipif(reference_missing() is not None, reason=str(reference_missing()))

NEW_TOKENS = 32
TOP = 5
# |engine - oracle| over the equal prefixes' logprobs. bf16 against transformers' bf16: both round, in different
# places (transformers every activation, the engine a linear layer's input); measured 0.21. WINT8 / WINT4 against
# float64 on the dequantized weights: the engine's bf16 rounding of each linear's input; measured 0.13 / 0.08.
LOGPROB_TOL = {"bfloat16": 0.35, "wint8": 0.25, "wint4": 0.25}
# the share of the 8 x 32 tokens that must match before the prompts diverge (measured 0.59 / 0.75 / 0.72): a
# wrong scale or layout diverges at once, outside the top 5
MIN_EQUAL = {"bfloat16": 0.4, "wint8": 0.5, "wint4": 0.5}
ENGINE = dict(dtype="bfloat16", max_num_seqs=4, block_size=8, max_num_batched_tokens=40)
LINEAR = ("_proj.weight",)


def _dequantized_copy(source, target, bits: int) -> None:
    """The checkpoint with the weights the engine multiplies under WINT{bits} (torch layout: linears [out, in])."""
    target.mkdir()
    tensors = read_tensors(source)
    for name, t in tensors.items():
        if name.endswith(LINEAR):
            tensors[name] = np.ascontiguousarray(dequantize(*quantize(t.T, bits, "bfloat16")).T)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            tensors[name] = round_to_bf16(t)
    write_tensors(target, tensors, sharded=False)
    for f in source.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and not f.name.endswith(".index.json"):
            shutil.copy(f, target / f.name)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """{method: (directory the engine serves, prompts, oracle results)}."""
    root = tmp_path_factory.mktemp("precision")
    directory = root / "ernie"
    vocab = write_tokenizer(directory, "Ernie4_5ForCausalLM", 384)
    run_oracle([write_job("Ernie4_5ForCausalLM", directory, seed=11, vocab_size=vocab)])
    prompts = _prompts(vocab)
    jobs, out = [], {}
    for method in ("bfloat16", "wint8", "wint4"):
        oracle_dir, dtype = directory, "bfloat16"
        if method != "bfloat16":
            oracle_dir, dtype = root / method, "float64"
            _dequantized_copy(directory, oracle_dir, 8 if method == "wint8" else 4)
        jobs.append({"job": "generate", "directory": str(oracle_dir), "prompts": prompts,
                     "max_new_tokens": NEW_TOKENS, "dtype": dtype})
    for method, result in zip(("bfloat16", "wint8", "wint4"), run_oracle(jobs)):
        out[method] = (directory, prompts, result["results"])
    assert json.loads((directory / "config.json").read_text())["torch_dtype"] == "float32"
    return out


def check_logprobs_close(ours, oracle, tol: float, what: str) -> tuple[int, int, float]:
    """vLLM's comparison; returns (prompts that diverged at a top-5 near-tie, tokens compared equal, the largest
    logprob difference over them)."""
    diverged, equal, worst = 0, 0, 0.0
    for i, (out, ref) in enumerate(zip(ours, oracle)):
        tokens, logprobs = out.outputs.token_ids, out.outputs.logprobs
        for pos, (a, b) in enumerate(zip(tokens, ref["tokens"])):
            if a != b:
                assert a in ref["top_ids"][pos] and b in logprobs[pos].top_token_ids, \
                    f"{what} prompt {i} position {pos}: {a} vs {b} outside each other's top {TOP}"
                diverged += 1
                break
            equal += 1
            worst = max(worst, abs(logprobs[pos].logprob - ref["logprobs"][pos]))
            assert worst <= tol, (what, i, pos, worst)
    return diverged, equal, worst


@pytest.mark.parametrize("method", ["bfloat16", "wint8", "wint4"])
def test_engine_matches_transformers_in_its_precision(cases, method):
    directory, prompts, oracle = cases[method]
    quantization = None if method == "bfloat16" else method
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=TOP)
    single = LLM(model=str(directory), quantization=quantization, **ENGINE).generate(prompts, params, use_tqdm=False)
    diverged, equal, worst = check_logprobs_close(single, oracle, LOGPROB_TOL[method], method)
    print(f"{method}: {diverged} of {len(prompts)} prompts diverged at a top-{TOP} near-tie; {equal} tokens equal, "
          f"logprobs within {worst:.3f}")
    assert equal >= MIN_EQUAL[method] * len(prompts) * NEW_TOKENS
    pd = LLM(model=str(directory), quantization=quantization, splitwise=True,
             **ENGINE).generate(prompts, params, use_tqdm=False)
    assert [o.outputs.token_ids for o in pd] == [o.outputs.token_ids for o in single]
    assert [o.outputs.logprobs for o in pd] == [o.outputs.logprobs for o in single]
