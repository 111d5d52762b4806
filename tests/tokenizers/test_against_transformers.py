"""The checkpoint tokenizers and chat templates against transformers on the same files (the independent
implementation: AutoTokenizer + apply_chat_template, in a subprocess, tests/tokenizers/hf_tokenizer_oracle.py):
rendered prompts with and without the generation prompt, and token ids with and without special tokens, equal."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fastdeploy.entrypoints.chat_template import chat_prompt_ids, chat_template_for
from fastdeploy.tokenizer import get_tokenizer
from tests.tokenizer_files import CHATML_TEMPLATE, write_ernie_tokenizer, write_hf_tokenizer

ORACLE = Path(__file__).with_name("hf_tokenizer_oracle.py")
CONVERSATIONS = [
    [{"role": "user", "content": "你好，你是谁？"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world 🎉"},
     {"role": "assistant", "content": "hi 👍🏽"}, {"role": "user", "content": "again, e\u0301 a\u0308"}],
]
TEXTS = ["hello world", "你好，你是谁？", "emoji 🎉👍🏽 😀 unseen", "  two  spaces\tand tab", "日本語 한국어 Ω",
         "combining e\u0301 a\u0308 n\u0303",
         "<|begin_of_sentence|>User: hi\nAssistant: ", "<|im_start|>user\nhi<|im_end|>\n"]
FAMILIES = {
    "ernie": lambda d: write_ernie_tokenizer(d),
    "ernie-dummy-prefix": lambda d: write_ernie_tokenizer(d, add_dummy_prefix=True),
    "hf": lambda d: write_hf_tokenizer(d),
    "hf-bos": lambda d: write_hf_tokenizer(d, bos=True, template_file=True),
    # a tokenizer that adds BOS to plain text with a template that writes none: transformers' chat ids have none
    "hf-bos-chatml": lambda d: write_hf_tokenizer(d, bos=True, chat_template=CHATML_TEMPLATE),
}


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed (pip install '.[reference]')")
    directories = {}
    for name, write in FAMILIES.items():
        directories[name] = tmp_path_factory.mktemp(name)
        write(directories[name])
    jobs = [{"directory": str(d), "conversations": CONVERSATIONS, "texts": TEXTS} for d in directories.values()]
    done = subprocess.run([sys.executable, str(ORACLE)], input=json.dumps(jobs), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: (directories[name], result) for name, result in zip(directories, json.loads(done.stdout))}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_chat_template_renders_as_transformers(oracle, family):
    directory, expected = oracle[family]
    template = chat_template_for(get_tokenizer(str(directory)))
    for messages, (without, with_prompt) in zip(CONVERSATIONS, expected["renders"]):
        assert template.render(messages, add_generation_prompt=False) == without
        assert template.render(messages, add_generation_prompt=True) == with_prompt
        assert with_prompt != without     # the generation prompt is there


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_token_ids_equal_transformers(oracle, family):
    directory, expected = oracle[family]
    tokenizer = get_tokenizer(str(directory))
    for text, (with_specials, without) in zip(TEXTS, expected["encoded"]):
        assert tokenizer.encode(text) == with_specials, text
        assert tokenizer.encode(text, add_special_tokens=False) == without, text


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_chat_prompt_has_bos_once_at_most(oracle, family):
    """The chat prompt's tokens are apply_chat_template(tokenize=True)'s: BOS where the template writes it, never
    twice (the Llama-style tokenizer adds BOS to plain text too)."""
    directory, expected = oracle[family]
    tokenizer = get_tokenizer(str(directory))
    for (_, text), ids in zip(expected["renders"], expected["chat_ids"]):
        assert chat_prompt_ids(tokenizer, text) == ids
        if tokenizer.bos_token_id is not None:
            assert ids.count(tokenizer.bos_token_id) == (1 if family == "hf-bos" else 0)
