"""The offline LLM's sampling defaults and memory as the servers have them (docs/serving.md "Sampling defaults",
"Memory"): a checkpoint's generation_config.json sampling values are the defaults of the calls that pass no
SamplingParams (`generation_config="vllm"` reads none), and `fastdeploy generate` flags given win over the file
(request > file > built-in); `LLM(splitwise=True)` shares one KV budget between P and D as `serve --pd` does."""
from __future__ import annotations

import json

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.entrypoints.cli import main
from tests.checkpoint_files import write_numpy_checkpoint

FILE_DEFAULTS = {"repetition_penalty": 1.8, "top_k": 7}   # greedy stays greedy; the penalty changes the tokens
PROMPT = "hello world"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = write_numpy_checkpoint(tmp_path_factory.mktemp("defaults") / "ckpt", tokenizer=True)
    config = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(json.dumps({**config, **FILE_DEFAULTS}))
    return str(directory)


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(model=checkpoint, max_num_seqs=1)


def tokens(llm: LLM, params: SamplingParams | None = None) -> list[int]:
    return llm.generate(PROMPT, params, use_tqdm=False)[0].outputs.token_ids


def test_a_call_without_params_uses_the_checkpoints_generation_config(llm):
    assert llm.get_default_sampling_params() == SamplingParams(**FILE_DEFAULTS)
    from_file = tokens(llm)
    assert from_file == tokens(llm, SamplingParams(**FILE_DEFAULTS))
    assert from_file != tokens(llm, SamplingParams())   # the file's values changed the request
    assert llm.chat([{"role": "user", "content": PROMPT}], use_tqdm=False)[0].outputs.token_ids == \
        llm.chat([{"role": "user", "content": PROMPT}], SamplingParams(**FILE_DEFAULTS), use_tqdm=False)[0] \
        .outputs.token_ids


def test_generation_config_vllm_reads_no_file(checkpoint, llm):
    plain = LLM(model=checkpoint, max_num_seqs=1, generation_config="vllm")
    assert plain.get_default_sampling_params() == SamplingParams()
    assert tokens(plain) == tokens(llm, SamplingParams())


def test_a_bad_generation_config_is_one_line_naming_the_argument(checkpoint, tmp_path):
    with pytest.raises(ValueError, match="'generation_config'.*no generation_config.json"):
        LLM(model=checkpoint, generation_config=str(tmp_path))


def test_generate_cli_flags_win_over_the_file_which_wins_over_the_built_in(checkpoint, llm, capsys):
    for argv, params in ((["--repetition-penalty", "1.0"], SamplingParams(top_k=7)),
                         ([], SamplingParams(**FILE_DEFAULTS)),
                         (["--generation-config", "vllm"], SamplingParams())):
        assert main(["generate", "--model", checkpoint, *argv, PROMPT]) == 0
        text = capsys.readouterr().out.rstrip("\n").rsplit("\n", 1)[0]
        assert text == llm.generate(PROMPT, params, use_tqdm=False)[0].outputs.text, argv


def test_splitwise_shares_one_kv_budget_between_prefill_and_decode(checkpoint):
    """Before: P and D each sized their cache from the whole budget (twice the memory asked for)."""
    budget = 2 ** 20   # below every slot at max_model_len, so that the budget, not the slots, sizes the cache
    single = LLM(model=checkpoint, kv_cache_memory_bytes=budget).resource_stats().total_kv_blocks
    pair = LLM(model=checkpoint, kv_cache_memory_bytes=budget, splitwise=True)
    blocks = {role: stats.total_kv_blocks for role, stats in pair.resource_stats().items()}
    assert blocks["prefill"] + blocks["decode"] <= single and blocks["prefill"] == blocks["decode"] > 0
    assert "prefill and decode in one process share it" in pair.config.cache.budget_source
    assert tokens(pair, SamplingParams(max_tokens=8)) == tokens(LLM(model=checkpoint), SamplingParams(max_tokens=8))
