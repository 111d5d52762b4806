"""OpenAI compatibility as vLLM serves it, checked with the `openai` client against one mixed instance
(docs/serving.md, "Request fields" and "Several choices"): `null` for optional fields, text content parts, the
`developer` role and `name`, lists of prompts, `n` > 1 seeded from `seed`, streamed choices with their `index`,
`stream_options` only with `stream`, `/v1/models`, `/tokenize`, `/detokenize`, `/version`, and the refusals that
say why."""
from __future__ import annotations

import json
from collections import defaultdict

import httpx
import pytest
from openai import BadRequestError, OpenAI

from fastdeploy import LLM, SamplingParams
from tests.services import launcher

PROMPTS = ["Hello", "The cat sat"]
TEMPLATE_TEXT = "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n"   # the built-in template, written out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with launcher.serving(wait_ready=True, log_dir=tmp_path_factory.mktemp("compat")) as server:
        yield server


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(model="fd-toy")


def _texts(llm: LLM, prompts, params) -> list[str]:
    return [out.outputs.text for out in llm.generate(prompts, params, use_tqdm=False)]


def test_null_optional_fields_mean_their_defaults(client, llm):
    """vLLM: `null` for an optional field is its default (greedy, the rest of the context, no stop, n 1)."""
    rest = lambda prompt: SamplingParams(max_tokens=512 - len(llm.tokenizer.encode(prompt)))   # fd-toy: 512
    (want,) = llm.generate("Hello", rest("Hello"), use_tqdm=False)
    nulls = {name: None for name in ("temperature", "top_p", "n", "max_tokens", "stop", "seed", "min_tokens",
                                     "stream", "stream_options", "user", "stop_token_ids", "logprobs",
                                     "presence_penalty", "frequency_penalty", "best_of", "echo")}
    got = client.completions.create(model="fd-toy", prompt="Hello", extra_body={**nulls, "suffix": None})
    assert got.choices[0].text == want.outputs.text
    assert got.usage.completion_tokens == len(want.outputs.token_ids) > 16
    chat = client.chat.completions.create(model="fd-toy", messages=[{"role": "user", "content": "Hi!"}],
                                          extra_body={**nulls, "max_completion_tokens": None, "tools": None,
                                                      "tool_choice": None, "response_format": None})
    chat_prompt = "<|user|>\nHi!\n<|assistant|>\n"
    assert chat.choices[0].message.content == _texts(llm, chat_prompt, rest(chat_prompt))[0]


def test_content_parts_developer_role_and_name(client, llm):
    """Text parts are joined with a newline, `developer` is rendered as `system`, `name` is accepted."""
    want = _texts(llm, "<|system|>\nBe brief.\n<|user|>\nHi!\nThere\n<|assistant|>\n", SamplingParams(max_tokens=8))
    got = client.chat.completions.create(
        model="fd-toy", max_tokens=8,
        messages=[{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                  {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Hi!"},
                                                               {"type": "text", "text": "There"}]}])
    assert got.choices[0].message.content == want[0]


def test_image_parts_and_tools_are_refused_saying_why(client):
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model="fd-toy", messages=messages)
    assert refused.value.body["param"] == "messages[0].content[0].type" and "text only" in refused.value.message
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for fields, param, why in [({"tools": [tool]}, "tools", "tool calling"),
                               ({"response_format": {"type": "json_object"}}, "response_format", "structured")]:
        with pytest.raises(BadRequestError) as refused:
            client.chat.completions.create(model="fd-toy", messages=[{"role": "user", "content": "Hi"}], **fields)
        assert refused.value.body["param"] == param and why in refused.value.message


def test_a_list_of_prompts_gives_one_choice_per_prompt(client, llm):
    """Strings, token-id lists and a single token-id list: one choice per prompt, `index` in prompt order."""
    want = _texts(llm, PROMPTS, SamplingParams(max_tokens=6))
    got = client.completions.create(model="fd-toy", prompt=PROMPTS, max_tokens=6)
    assert [(c.index, c.text) for c in got.choices] == list(enumerate(want))
    ids = [[256, *p.encode()] for p in PROMPTS]
    by_ids = client.completions.create(model="fd-toy", prompt=ids, max_tokens=6)
    assert [c.text for c in sorted(by_ids.choices, key=lambda c: c.index)] == want
    one = client.completions.create(model="fd-toy", prompt=ids[1], max_tokens=6)
    assert [c.text for c in one.choices] == want[1:]
    assert got.usage.prompt_tokens == sum(len(i) for i in ids)


def test_n_samples_are_seeded_seed_plus_j_and_numbered_prompt_major(client, llm):
    """n = 2 over two prompts: choice p * n + j is prompt p sampled with seed + j (vLLM's rule), so it equals
    the in-process LLM with that seed, and the same request repeats exactly."""
    seed, n = 11, 2
    params = [SamplingParams(max_tokens=8, temperature=1.0, seed=seed + j) for j in range(n)]
    want = [text for p in PROMPTS for text in _texts(llm, [p] * n, params)]
    got = client.completions.create(model="fd-toy", prompt=PROMPTS, n=n, max_tokens=8, temperature=1.0, seed=seed)
    texts = [c.text for c in sorted(got.choices, key=lambda c: c.index)]
    assert texts == want and len(set(texts)) > 1
    again = client.completions.create(model="fd-toy", prompt=PROMPTS, n=n, max_tokens=8, temperature=1.0,
                                      seed=seed)
    assert [c.text for c in sorted(again.choices, key=lambda c: c.index)] == texts
    assert got.usage.completion_tokens == sum(len(o.outputs.token_ids) for p in PROMPTS
                                              for o in llm.generate([p] * n, params, use_tqdm=False))
    chat = client.chat.completions.create(model="fd-toy", messages=[{"role": "user", "content": "Hi!"}], n=3,
                                          max_tokens=6, temperature=1.0, seed=seed)
    want_chat = _texts(llm, ["<|user|>\nHi!\n<|assistant|>\n"] * 3,
                       [SamplingParams(max_tokens=6, temperature=1.0, seed=seed + j) for j in range(3)])
    assert [c.message.content for c in sorted(chat.choices, key=lambda c: c.index)] == want_chat


def test_streamed_choices_carry_their_index_and_usage_sums_them(client):
    """Streaming n = 2 over two prompts: per index the chunks concatenate to the non-streamed text, each index
    finishes once, and the usage chunk sums every choice."""
    fields = dict(model="fd-toy", prompt=PROMPTS, n=2, max_tokens=10, temperature=1.0, seed=5)
    whole = client.completions.create(**fields)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **fields))
    texts, finishes = defaultdict(str), defaultdict(list)
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.text
        if choice.finish_reason is not None:
            finishes[choice.index].append(choice.finish_reason)
    assert dict(texts) == {c.index: c.text for c in whole.choices}
    assert dict(finishes) == {c.index: [c.finish_reason] for c in whole.choices}
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    chat = list(client.chat.completions.create(model="fd-toy", messages=[{"role": "user", "content": "Hi"}], n=2,
                                               max_tokens=4, temperature=1.0, seed=5, stream=True))
    roles = [c.choices[0].index for c in chat if c.choices[0].delta.role == "assistant"]
    assert roles == [0, 1]


def test_stream_options_need_stream(client):
    """vLLM answers 400 to `stream_options` without `stream: true`."""
    with pytest.raises(BadRequestError) as refused:
        client.completions.create(model="fd-toy", prompt="Hi", stream_options={"include_usage": True})
    assert refused.value.body["param"] == "stream_options"


def test_models_tokenize_detokenize_and_version(server, client):
    """/v1/models entries carry `created` and `owned_by`; /tokenize and /detokenize use vLLM's shapes; /version."""
    (card,) = client.models.list().data
    assert (card.id, card.owned_by, card.object) == ("fd-toy", "fastdeploy", "model") and card.created > 1.6e9
    tokens = httpx.post(server.url + "/tokenize", json={"model": "fd-toy", "prompt": "Hi!"}).json()
    assert tokens == {"count": 4, "max_model_len": 512, "tokens": [256, 72, 105, 33], "token_strs": None}
    chat = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "developer", "content": "Be brief."},
                                                                   {"role": "user", "content": "Hi!"}],
                                                      "return_token_strs": True}).json()
    assert chat["tokens"] == [256, *TEMPLATE_TEXT.encode()] and chat["token_strs"][:3] == ["<|bos|>", "<", "|"]
    assert chat["token_strs"][11] == "<0x0A>"
    text = httpx.post(server.url + "/detokenize", json={"model": "fd-toy", "tokens": chat["tokens"]}).json()
    assert text == {"prompt": TEMPLATE_TEXT}
    version = httpx.get(server.url + "/version").json()
    assert isinstance(version["version"], str) and version["version"]


def test_generation_prompt_flags_render_as_vllm_does(server):
    """add_generation_prompt false leaves the assistant header out; continue_final_message ends the prompt right
    after the final assistant message's content (fixed expected strings)."""
    def rendered(**fields) -> str:
        body = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}], **fields}
        tokens = httpx.post(server.url + "/tokenize", json={**body, "add_special_tokens": False}).json()["tokens"]
        return bytes(tokens).decode()

    assert rendered() == "<|user|>\nHi\n<|assistant|>\nHel\n<|assistant|>\n"
    assert rendered(add_generation_prompt=False) == "<|user|>\nHi\n<|assistant|>\nHel\n"
    assert rendered(continue_final_message=True) == "<|user|>\nHi\n<|assistant|>\nHel"


def test_continue_final_message_continues_the_assistant_text(client, llm):
    want = _texts(llm, "<|user|>\nHi\n<|assistant|>\nHel", SamplingParams(max_tokens=5))[0]
    got = client.chat.completions.create(model="fd-toy", max_tokens=5, messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert got.choices[0].message.content == want


def test_prompt_plus_max_tokens_equal_to_max_model_len_is_served(client):
    """The bound is inclusive: prompt + max_tokens == max_model_len (512) is accepted, one more is refused."""
    ids = [256] + [65] * 499
    got = client.completions.create(model="fd-toy", prompt=ids, max_tokens=12, extra_body={"stop": ["\n"]})
    assert got.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(BadRequestError) as refused:
        client.completions.create(model="fd-toy", prompt=ids, max_tokens=13)
    assert refused.value.body["param"] == "max_tokens" and "512" in refused.value.message


def test_seed_reaches_the_engine(client):
    """Seeded sampling at temperature > 0 repeats, and two seeds differ (a dropped seed would be random)."""
    runs = [client.completions.create(model="fd-toy", prompt="Once", max_tokens=12, temperature=1.0,
                                      seed=seed).choices[0].text for seed in (3, 3, 4, 4)]
    assert runs[0] == runs[1] and runs[2] == runs[3] and runs[0] != runs[2], json.dumps(runs)
