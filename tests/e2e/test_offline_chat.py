"""Offline chat (vLLM's LLM.chat / get_tokenizer, `fastdeploy generate --chat`): a conversation is rendered with
the model's chat template into the ids chat completions use, then generated."""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.entrypoints.chat_template import chat_prompt_ids, chat_template_for
from fastdeploy.entrypoints.cli import main
from tests.checkpoint_files import write_numpy_checkpoint

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "你好，你是谁？"}]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(model=str(write_numpy_checkpoint(tmp_path_factory.mktemp("chat") / "ckpt", tokenizer=True)),
               max_num_seqs=2)


def test_chat_generates_from_the_templates_ids(llm):
    tokenizer = llm.get_tokenizer()
    ids = chat_prompt_ids(tokenizer, chat_template_for(tokenizer).render(MESSAGES, add_generation_prompt=True))
    (chat,) = llm.chat(MESSAGES, PARAMS, use_tqdm=False)
    assert chat.prompt_token_ids == ids
    assert chat.outputs.token_ids == llm.generate([ids], PARAMS, use_tqdm=False)[0].outputs.token_ids
    two = llm.chat([MESSAGES, MESSAGES[1:]], PARAMS, use_tqdm=False)
    assert two[0].outputs.token_ids == chat.outputs.token_ids and len(two) == 2


def test_a_bad_conversation_is_refused_naming_it(llm):
    with pytest.raises(ValueError, match="conversation 1"):
        llm.chat([MESSAGES, [{"role": "user", "content": 7}]], PARAMS, use_tqdm=False)
    with pytest.raises(ValueError, match="'messages'"):
        llm.chat("hello", PARAMS)


def test_generate_chat_sends_one_user_message(capsys):
    assert main(["generate", "--model", "fd-tiny", "--chat", "--max-tokens", "4", "hello"]) == 0
    assert "tokens," in capsys.readouterr().out
