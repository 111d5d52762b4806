"""Streaming detokenization, stop strings and logprobs token strings with the checkpoint tokenizers
(sentencepiece with byte fallback, byte-level BPE): however the output tokens are split into steps, the streamed
increments concatenate to the non-streamed text, no increment holds half a character, a token's text reads as it
does after the prompt (sentencepiece's leading space), and a stop string ends the text wherever the token
boundaries fall."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdeploy.entrypoints.openai.logprobs import ChatLogprobsRenderer, CompletionLogprobsRenderer
from fastdeploy.output.detokenizer import IncrementalDetokenizer, completion_text
from fastdeploy.schema.request import TokenLogprob
from fastdeploy.tokenizer import get_tokenizer
from tests.tokenizer_files import write_ernie_tokenizer, write_hf_tokenizer

FAMILIES = {
    "ernie": lambda d: write_ernie_tokenizer(d),
    "ernie-dummy-prefix": lambda d: write_ernie_tokenizer(d, add_dummy_prefix=True),
    "hf": lambda d: write_hf_tokenizer(d),
}
OUTPUTS = ["你好，我是人工智能助手。", "emoji 😀🎉 then 👍🏽!", "日本語のテスト and Ω", " leading space", "a\nb  c"]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    out = {}
    for name, write in FAMILIES.items():
        directory = tmp_path_factory.mktemp(name)
        write(directory)
        out[name] = get_tokenizer(str(directory))
    return out


def _stream(tokenizer, prompt, ids, cuts, stop=(), include=False, reason="length"):
    detokenizer = IncrementalDetokenizer(tokenizer, stop, include, prompt)
    bounds = [0, *sorted(c % (len(ids) + 1) for c in cuts), len(ids)]
    pieces = [detokenizer.push(ids[a:b]) for a, b in zip(bounds, bounds[1:])]
    return pieces + [detokenizer.finish(reason)], detokenizer


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_split_streams_the_non_streamed_text(tokenizers, family):
    """Every cut point of every output: multi-byte characters split over byte-fallback tokens (😀 is four byte
    tokens) are never emitted half, and the text is what the tokens decode to after the prompt."""
    tok = tokenizers[family]
    prompt = tok.encode("User: hi\nAssistant:", add_special_tokens=False)
    for text in OUTPUTS:
        ids = tok.encode(text, add_special_tokens=False)
        whole = completion_text(tok, ids, (), "length", prompt_token_ids=prompt)
        assert tok.decode(prompt) + whole == tok.decode(prompt + ids)
        for a in range(len(ids) + 1):
            for b in range(a, len(ids) + 1):
                pieces, _ = _stream(tok, prompt, ids, [a, b])
                assert "".join(pieces) == whole
                assert not any("\ufffd" in p for p in pieces), (text, a, b, pieces)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_random_tokens_stream_the_non_streamed_text(tokenizers, family):
    """Any ids at all (byte pieces in any order, invalid UTF-8, special tokens): streamed == non-streamed."""
    tok = tokenizers[family]

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(ids=st.lists(st.integers(0, tok.vocab_size - 1), max_size=24),
           prompt=st.lists(st.integers(0, tok.vocab_size - 1), max_size=6),
           cuts=st.lists(st.integers(0, 100), max_size=6))
    def check(ids, prompt, cuts):
        pieces, _ = _stream(tok, prompt, ids, cuts)
        assert "".join(pieces) == completion_text(tok, ids, (), "length", prompt_token_ids=prompt)

    check()


def test_sentencepiece_leading_space_reads_as_after_the_prompt(tokenizers):
    """With a dummy prefix sentencepiece drops the space of a `▁` that starts the text; a completion's first
    token follows the prompt, so its space is kept (the prompt's text + the completion's = the whole text)."""
    tok = tokenizers["ernie-dummy-prefix"]
    ids = tok.encode("hello world", add_special_tokens=False)
    assert tok.token_piece(ids[-1]).startswith("\u2581")
    prompt, output = ids[:-1], ids[-1:]
    assert tok.decode(output) == "world"                                   # alone: no space
    assert completion_text(tok, output, (), "length", prompt_token_ids=prompt) == " world"
    pieces, _ = _stream(tok, prompt, ids[-1:] * 3, [1, 2])
    assert pieces[:3] == [" world"] * 3


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_token_boundaries(tokenizers, family, include):
    """The stop string lies across tokens that are not encode(stop): the text still ends there and `stopped`
    tells the server to end the request ("stop")."""
    tok = tokenizers[family]
    text = "the quick brown fox jumps 你好 over"
    ids = tok.encode(text, add_special_tokens=False)
    for stop in ("ck bro", "s 你", "好 o"):
        stop_ids = tok.encode(stop, add_special_tokens=False)   # what the engine matches: not in the output
        assert not any(ids[k:k + len(stop_ids)] == stop_ids for k in range(len(ids))), stop
        expected = text[:text.index(stop) + (len(stop) if include else 0)]
        for cut in range(len(ids) + 1):
            pieces, detokenizer = _stream(tok, (), ids, [cut], (stop,), include)
            assert "".join(pieces) == expected and detokenizer.stopped, (stop, cut, pieces)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logprobs_token_strings(tokenizers, family):
    """Each token's logprobs text is its text when whole characters, `<0xNN>` bytes otherwise; the chat form's
    `bytes` add up to the text, and the completion form's `text_offset` counts the characters before each token."""
    tok = tokenizers[family]
    prompt = tok.encode("Assistant:", add_special_tokens=False)
    ids = tok.encode(" 你好 😀 ok", add_special_tokens=False)
    text = completion_text(tok, ids, (), "length", prompt_token_ids=prompt)
    entries = [TokenLogprob(token_id=i, logprob=-1.0, top_token_ids=[i], top_logprobs=[-1.0]) for i in ids]
    chat = ChatLogprobsRenderer(tok)
    chat.push(entries)
    content = chat.result().content
    assert bytes(b for c in content for b in c.bytes).decode() == text
    assert [c.token for c in content] == [tok.token_text(i) for i in ids]
    assert any(c.token.startswith("<0x") for c in content)     # 😀 is byte pieces here
    completion = CompletionLogprobsRenderer(tok)
    completion.push(entries)
    result = completion.result()
    for token_id, token, offset in zip(ids, result.tokens, result.text_offset):
        if not token.startswith("<0x"):
            assert text[offset:offset + len(token)] == token
