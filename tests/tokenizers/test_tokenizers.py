"""The checkpoint tokenizers (fastdeploy/tokenizer): round trips, special tokens, add_special_tokens, the
tokenizer_config.json rules, token texts, and the one-line errors of get_tokenizer."""
from __future__ import annotations

import json
import unicodedata

import pytest

from fastdeploy.tokenizer import ByteTokenizer, get_tokenizer
from tests.tokenizer_files import write_ernie_tokenizer, write_hf_tokenizer

TEXTS = ["hello world", "  two  spaces and a tab\t.", "你好，你是谁？", "日本語のテスト", "emoji 🎉👍🏽 and 😀 unseen",
         "e\u0301 a\u0308 combining marks", "mixed: café 한국어 Ω≈π 🚀!", ""]

FAMILIES = {
    "ernie": lambda d: write_ernie_tokenizer(d),
    "ernie-dummy-prefix": lambda d: write_ernie_tokenizer(d, add_dummy_prefix=True),
    "hf": lambda d: write_hf_tokenizer(d),
    "hf-bos": lambda d: write_hf_tokenizer(d, bos=True),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    size = FAMILIES[request.param](directory)
    return request.param, directory, size, get_tokenizer(str(directory))


def test_round_trip_is_exact(family):
    """decode(encode(s)) == s, up to the tokenizer's own normalisation (the Qwen-like one composes: NFC)."""
    name, _, size, tok = family
    assert tok.vocab_size == size
    for text in TEXTS:
        expected = unicodedata.normalize("NFC", text) if name == "hf" else text
        ids = tok.encode(text, add_special_tokens=False)
        assert all(0 <= i < size for i in ids)
        assert tok.decode(ids) == expected, text
        assert tok.decode(tok.encode(text)) == expected, text     # BOS, where added, is skipped


def test_unseen_characters_use_byte_fallback(family):
    name, _, _, tok = family
    ids = tok.encode("😀", add_special_tokens=False)    # not in the training corpus
    assert tok.decode(ids) == "😀"
    if name == "ernie-dummy-prefix":      # sentencepiece's dummy prefix: a "▁" first
        assert tok.token_piece(ids[0]) == "\u2581"
        ids = ids[1:]
    # no token is the whole character: each is spelled by its bytes (byte-level BPE may have merged two)
    assert "".join(tok.token_text(i) for i in ids) == "<0xF0><0x9F><0x98><0x80>"
    assert b"".join(tok.token_bytes(i) for i in ids) == "😀".encode()


def test_bos_only_where_the_config_asks(family):
    name, _, _, tok = family
    plain = tok.encode("hello", add_special_tokens=False)
    with_specials = tok.encode("hello")
    if name == "hf-bos":
        assert tok.add_bos_token and with_specials == [tok.bos_token_id, *plain]
    else:   # ERNIE's add_bos_token is false; the Qwen-like tokenizer has no BOS at all
        assert not tok.add_bos_token and with_specials == plain


def test_special_tokens_in_text_become_their_ids(family):
    name, _, _, tok = family
    marker = "<|begin_of_sentence|>" if name.startswith("ernie") else "<|im_start|>"
    ids = tok.encode(f"{marker}user hi", add_special_tokens=False)
    assert ids[0] == tok.encode(marker, add_special_tokens=False)[0]
    assert len(tok.encode(marker, add_special_tokens=False)) == 1
    assert tok.decode(ids) == "user hi"                           # special tokens are skipped
    assert tok.token_text(ids[0]) == marker
    assert tok.decode([tok.eos_token_id]) == ""


def test_token_texts_are_distinct_and_add_up(family):
    _, _, size, tok = family
    texts = [tok.token_text(i) for i in range(size)]
    assert len(set(texts)) == size
    ids = tok.encode("hello 你好 world", add_special_tokens=False)
    joined = b"".join(tok.token_bytes(i) for i in ids).decode()
    assert joined.strip() == "hello 你好 world"     # a leading sentencepiece space is a space in token bytes


def test_chat_template_and_template_variables(family):
    name, _, _, tok = family
    assert tok.chat_template
    if name.startswith("ernie"):
        assert tok.special_tokens["cls_token"] == "<|begin_of_sentence|>"
        assert tok.special_tokens["sep_token"] == "<|end_of_sentence|>"
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
    else:
        assert tok.special_tokens["eos_token"] == "<|im_end|>"


def test_identity_names_the_files(tmp_path):
    write_hf_tokenizer(tmp_path / "a")
    write_hf_tokenizer(tmp_path / "b", vocab_size=400)
    a, b = get_tokenizer(str(tmp_path / "a")), get_tokenizer(str(tmp_path / "b"))
    assert a.identity == get_tokenizer(str(tmp_path / "a")).identity != b.identity


def test_padded_model_vocabulary_ids_have_no_text(tmp_path):
    size = write_hf_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": size + 30}))
    tok = get_tokenizer(str(tmp_path))
    assert tok.vocab_size == size + 30
    assert tok.decode([*tok.encode("hi"), size + 5]) == "hi"
    assert tok.token_bytes(size + 5) is None and tok.token_text(size + 5) == f"<unused:{size + 5}>"


def test_config_add_bos_token_wins_over_the_post_processor(tmp_path):
    write_hf_tokenizer(tmp_path, bos=True)
    path = tmp_path / "tokenizer_config.json"
    config = json.loads(path.read_text())
    tok = get_tokenizer(str(tmp_path))
    for flag in (False, True):
        path.write_text(json.dumps({**config, "add_bos_token": flag}))
        flagged = get_tokenizer(str(tmp_path))
        ids = flagged.encode("hello")
        assert ids.count(tok.bos_token_id) == int(flag)          # never doubled
        assert ids[int(flag):] == tok.encode("hello", add_special_tokens=False)


def test_template_file_is_read(tmp_path):
    write_hf_tokenizer(tmp_path, chat_template="{{ 'file' }}", template_file=True)
    assert get_tokenizer(str(tmp_path)).chat_template == "{{ 'file' }}"


def test_embedded_names_keep_the_byte_tokenizer():
    tok = get_tokenizer("fd-tiny")
    assert isinstance(tok, ByteTokenizer) and tok.chat_template is None
    assert tok.encode("a") == [tok.bos_token_id, 97] and tok.encode("a", add_special_tokens=False) == [97]


@pytest.mark.parametrize("case, message", [
    ("missing", "not a checkpoint directory"),
    ("empty", "no tokenizer: the directory has neither tokenizer.json nor tokenizer.model"),
    ("bad-json", "tokenizer_config.json: not valid JSON"),
    ("bad-model", "tokenizer.model: not a sentencepiece model"),
    ("bad-tokenizer-json", "tokenizer.json: cannot load it"),
    ("eos-not-in-vocab", "field 'eos_token' is '<nope>', which is not in the vocabulary"),
    ("bad-flag", "field 'add_bos_token' must be true or false"),
])
def test_bad_tokenizer_files_are_one_line_naming_the_file(tmp_path, case, message):
    directory = tmp_path / "ckpt"
    if case != "missing":
        directory.mkdir()
    if case == "bad-json":
        write_hf_tokenizer(directory)
        (directory / "tokenizer_config.json").write_text("{not json")
    elif case == "bad-model":
        (directory / "tokenizer.model").write_bytes(b"\x00garbage")
    elif case == "bad-tokenizer-json":
        (directory / "tokenizer.json").write_text('{"model": 3}')
    elif case in ("eos-not-in-vocab", "bad-flag"):
        write_ernie_tokenizer(directory)
        path = directory / "tokenizer_config.json"
        config = json.loads(path.read_text())
        config.update({"eos_token": "<nope>"} if case == "eos-not-in-vocab" else {"add_bos_token": "yes"})
        path.write_text(json.dumps(config))
    with pytest.raises(ValueError) as error:
        get_tokenizer(str(directory))
    text = str(error.value)
    assert message in text and "\n" not in text and str(directory) in text


def test_checkpoint_templates_render_the_published_formats(tmp_path):
    """ERNIE-4.5's chat format (the template of transformers' Ernie4_5Tokenizer) and ChatML, with the generation prompt last (no transformers
    needed: tests/tokenizers/test_against_transformers.py compares with apply_chat_template)."""
    from fastdeploy.entrypoints.chat_template import chat_prompt_ids, chat_template_for
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "你好"},
                {"role": "assistant", "content": "A"}, {"role": "user", "content": "Q"}]
    write_ernie_tokenizer(tmp_path / "ernie")
    ernie = get_tokenizer(str(tmp_path / "ernie"))
    text = chat_template_for(ernie).render(messages, add_generation_prompt=True)
    assert text == "<|begin_of_sentence|>S\nUser: 你好\nAssistant: A<|end_of_sentence|>User: Q\nAssistant: "
    assert chat_prompt_ids(ernie, text)[0] == ernie.encode("<|begin_of_sentence|>", add_special_tokens=False)[0]
    write_hf_tokenizer(tmp_path / "hf")
    text = chat_template_for(get_tokenizer(str(tmp_path / "hf"))).render(messages[1:], add_generation_prompt=True)
    assert text == ("<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
                    "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n")


def test_a_checkpoint_without_a_template_has_none_and_the_flag_wins(tmp_path):
    from fastdeploy.entrypoints.chat_template import chat_template_for
    write_ernie_tokenizer(tmp_path, chat_template=None)
    tok = get_tokenizer(str(tmp_path))
    assert tok.chat_template is None and chat_template_for(tok) is None
    (tmp_path / "t.jinja").write_text("{{ cls_token }}{{ messages[0]['content'] }}")
    assert chat_template_for(tok, str(tmp_path / "t.jinja")).render([{"role": "user", "content": "x"}]) == \
        "<|begin_of_sentence|>x"
