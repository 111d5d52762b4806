"""Checkpoint models against an independent implementation (docs/testing.md "Checkpoint oracle"): tiny random
ERNIE-4.5 dense and Qwen3 checkpoints written by transformers itself (torch layout) and rewritten as the Paddle
layout, served through LLM(model=PATH) single instance and in-process PD, with prefix caching on and off; greedy
tokens must equal transformers' (CPU torch, float64, in a subprocess) for 32 tokens of 8 prompts, and logprobs
agree within LOGPROB_TOL.

The slips these catch (each planted once and seen to fail, docs/testing.md): the wrong rotary variant, a weight
transposed by the map, a KV head mapped to the wrong query group.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from tests.checkpoint_files import (oracle_generate, reference_missing, run_oracle, to_paddle_layout, write_job,
                                    write_tokenizer)

from fastdeploy import LLM, SamplingParams

pytestmark = pytest.mark.skipif(reference_missing() is not None, reason=str(reference_missing()))

NEW_TOKENS = 32
# float64 engine vs transformers in float64: its RMSNorm and RoPE compute in float32 (modeling_ernie4_5.py,
# modeling_qwen3.py), so logprobs differ by ~1e-6 (measured <= 3e-6); greedy ties are excluded by MIN_MARGIN
LOGPROB_TOL = 1e-4
MIN_MARGIN = 1e-4   # top-1 minus top-2 logit: over 30x the measured engine-oracle difference
ENGINE = dict(dtype="float64", max_num_seqs=4, block_size=8, max_num_batched_tokens=40)


def _prompts(vocab: int) -> list[list[int]]:
    """8 prompts of 3..23 ids; the first and the last three share a 17-token prefix (two full blocks of 8): with
    4 slots the last ones start after the first computed it, so they hit the prefix cache."""
    rng = np.random.default_rng(7)
    shared = rng.integers(3, vocab, 17).tolist()
    distinct = [rng.integers(3, vocab, int(n)).tolist() for n in (3, 5, 11, 19)]
    with_prefix = [shared + rng.integers(3, vocab, int(n)).tolist() for n in (1, 2, 4, 6)]
    return [with_prefix[0], *distinct[:3], distinct[3], *with_prefix[1:]]


# (architecture, variant) -> what the oracle writes: torch layout, single file or sharded (max_shard_size)
VARIANTS = {
    ("Ernie4_5ForCausalLM", "single"): dict(seed=1),
    ("Ernie4_5ForCausalLM", "sharded-untied"): dict(seed=2, sharded=True, tie_word_embeddings=False),
    ("Ernie4_5ForCausalLM", "bfloat16"): dict(seed=3, save_dtype="bfloat16"),
    ("Qwen3ForCausalLM", "single"): dict(seed=4),
    ("Qwen3ForCausalLM", "sharded"): dict(seed=5, sharded=True),
    # config.json as transformers >= 4.56 saves it: `dtype` (not `torch_dtype`) with the torch layout
    ("Qwen3ForCausalLM", "as-saved"): dict(seed=6, published_config=False),
    ("LlamaForCausalLM", "single"): dict(seed=7),
    ("Qwen2ForCausalLM", "single"): dict(seed=8),   # q/k/v bias
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{(architecture, variant, layout): (directory, prompts, oracle results)}: one oracle run writes and
    decodes every torch-layout variant; each is also rewritten as the Paddle layout (sharded where it is)."""
    root = tmp_path_factory.mktemp("checkpoints")
    jobs, dirs = [], {}
    for (arch, variant), options in VARIANTS.items():
        directory = root / f"{arch}-{variant}-torch"
        vocab = write_tokenizer(directory, arch, 384)
        jobs.append(write_job(arch, directory, vocab_size=vocab, **options))
        dirs[arch, variant] = (directory, _prompts(vocab))
    for directory, prompts in dirs.values():
        jobs.append({"job": "generate", "directory": str(directory), "prompts": prompts,
                     "max_new_tokens": NEW_TOKENS, "dtype": "float64"})
    results = run_oracle(jobs)[len(VARIANTS):]
    out = {}
    for ((arch, variant), (directory, prompts)), result in zip(dirs.items(), results):
        out[arch, variant, "torch"] = (directory, prompts, result["results"])
        if variant != "bfloat16":   # NumPy writes no bfloat16: the Paddle layout is float32
            paddle_dir = root / f"{arch}-{variant}-paddle"
            to_paddle_layout(directory, paddle_dir, sharded=VARIANTS[arch, variant].get("sharded", False))
            for name in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json"):
                if (directory / name).is_file():
                    (paddle_dir / name).write_bytes((directory / name).read_bytes())
            out[arch, variant, "paddle"] = (paddle_dir, prompts, result["results"])
    return out


def _check(llm: LLM, prompts: list[list[int]], oracle: list[dict], what: str) -> None:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for i, (output, ref) in enumerate(zip(outputs, oracle)):
        assert min(ref["margins"]) > MIN_MARGIN, f"{what}: prompt {i} has a near-tie in the oracle; pick a seed"
        assert list(output.outputs.token_ids) == ref["tokens"], f"{what}: prompt {i}"
        got = np.array([entry.logprob for entry in output.outputs.logprobs])
        np.testing.assert_allclose(got, ref["logprobs"], rtol=0, atol=LOGPROB_TOL, err_msg=f"{what}: prompt {i}")


@pytest.mark.parametrize("key", [(a, v, layout) for (a, v) in VARIANTS for layout in ("torch", "paddle")
                                 if not (v == "bfloat16" and layout == "paddle")],
                         ids=lambda key: "-".join(key))
def test_single_instance_matches_transformers(checkpoints, key):
    directory, prompts, oracle = checkpoints[key]
    sharded = (directory / "model.safetensors.index.json").is_file()
    assert sharded == ("sharded" in key[1]) and sharded != (directory / "model.safetensors").is_file()
    llm = LLM(model=str(directory), **ENGINE)
    assert llm.model.name == str(directory) and llm.model.num_mtp_layers == 0
    _check(llm, prompts, oracle, "-".join(key))


@pytest.mark.parametrize("arch", ["Ernie4_5ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM"])
@pytest.mark.parametrize("splitwise, prefix_caching", [(False, False), (True, True), (True, False)])
def test_pd_and_prefix_caching_match_transformers(checkpoints, arch, splitwise, prefix_caching):
    directory, prompts, oracle = checkpoints[arch, "single", "paddle" if splitwise else "torch"]
    llm = LLM(model=str(directory), splitwise=splitwise, enable_prefix_caching=prefix_caching, **ENGINE)
    _check(llm, prompts, oracle, f"{arch} splitwise={splitwise} prefix_caching={prefix_caching}")
    if prefix_caching:   # the shared prompt prefix was reused, so the cached path was the one checked
        outputs = llm.generate(prompts[-1:], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                               use_tqdm=False)
        assert outputs[0].num_cached_tokens >= 16


def test_float32_engine_matches_transformers(checkpoints):
    """The default dtype: float32 rounding may differ from float64 by more, but not the greedy tokens here."""
    directory, prompts, oracle = checkpoints["Qwen3ForCausalLM", "single", "torch"]
    llm = LLM(model=str(directory), **{**ENGINE, "dtype": "float32"})
    outputs = llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True),
                           use_tqdm=False)
    assert [list(o.outputs.token_ids) for o in outputs] == [r["tokens"] for r in oracle[:4]]


def test_published_config_form(checkpoints):
    """The fixture's config.json has the released checkpoints' fields (torch_dtype, rope_theta), which the oracle
    itself loaded: the engine is not judged on a form only it reads."""
    directory = checkpoints["Ernie4_5ForCausalLM", "single", "torch"][0]
    config = json.loads((directory / "config.json").read_text())
    assert config["torch_dtype"] == "float32" and "dtype" not in config
    assert config["rope_theta"] == 500000.0 and "rope_parameters" not in config
    assert json.loads((checkpoints["Ernie4_5ForCausalLM", "single", "paddle"][0] / "config.json")
                      .read_text())["dtype"] == "float32"


def test_a_checkpoint_as_transformers_saves_it_is_read_in_the_torch_layout(checkpoints):
    directory = checkpoints["Qwen3ForCausalLM", "as-saved", "torch"][0]
    config = json.loads((directory / "config.json").read_text())
    assert "dtype" in config and "torch_dtype" not in config


def test_oracle_generate_helper_round_trips(checkpoints):
    """oracle_generate (the one-job helper the other test files use) gives what the batched run gave."""
    directory, prompts, oracle = checkpoints["Qwen3ForCausalLM", "sharded", "torch"]
    assert oracle_generate(directory, prompts[:1], 4)[0]["tokens"] == oracle[0]["tokens"][:4]
