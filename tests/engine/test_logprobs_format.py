"""The API server's logprobs objects (docs/serving.md "Logprobs", fastdeploy/entrypoints/openai/logprobs.py): token
texts that never collide, `bytes` as the token's real bytes, `text_offset` in characters of the decoded text, the
chosen token kept in the completions map, and streamed pieces that concatenate to the whole."""
from __future__ import annotations

from fastdeploy.entrypoints.openai.logprobs import ChatLogprobsRenderer, CompletionLogprobsRenderer, token_text
from fastdeploy.model_executor.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer
from fastdeploy.schema.request import TokenLogprob

TOKENIZER = ByteTokenizer()
# "a€b" then EOS: the euro sign is three bytes, none a character alone
TOKENS = [ord("a"), 0xE2, 0x82, 0xAC, ord("b"), EOS_ID]
ENTRIES = [TokenLogprob(t, -0.5 - i, (ord("z"), t), (-0.25, -0.5 - i)) for i, t in enumerate(TOKENS)]


def test_token_texts_are_distinct_for_every_id():
    texts = [token_text(TOKENIZER, t) for t in range(VOCAB_SIZE)]
    assert len(set(texts)) == VOCAB_SIZE
    assert (texts[ord("a")], texts[ord("\n")], texts[0xE2]) == ("a", "\n", "<0xE2>")
    assert (texts[BOS_ID], texts[EOS_ID], texts[PAD_ID]) == ("<|bos|>", "<|eos|>", "<|pad|>")


def test_completion_logprobs_offsets_and_maps():
    """The three bytes of "€" start at its character (offset 1); "b" at 2; EOS adds no text. Each map holds the
    chosen token first, then the alternatives (logprobs + 1 entries when the chosen one is not among them)."""
    whole = CompletionLogprobsRenderer(TOKENIZER)
    result = whole.push(ENTRIES)
    assert result.text_offset == [0, 1, 1, 1, 2, 3]
    assert result.tokens == ["a", "<0xE2>", "<0x82>", "<0xAC>", "b", "<|eos|>"]
    assert result.token_logprobs == [e.logprob for e in ENTRIES]
    assert list(result.top_logprobs[0].items()) == [("a", -0.5), ("z", -0.25)]
    streamed = CompletionLogprobsRenderer(TOKENIZER)
    pieces = [streamed.push(ENTRIES[:2]), streamed.push([]), streamed.push(ENTRIES[2:])]
    assert pieces[1] is None
    assert pieces[0].text_offset + pieces[2].text_offset == result.text_offset
    assert streamed.result() == result == whole.result()


def test_chat_logprobs_bytes_and_alternatives():
    renderer = ChatLogprobsRenderer(TOKENIZER)
    content = renderer.push(ENTRIES).content
    assert [c.bytes for c in content] == [[ord("a")], [0xE2], [0x82], [0xAC], [ord("b")], None]
    assert bytes(b for c in content for b in c.bytes or ()).decode() == "a€b"
    assert [(t.token, t.logprob) for t in content[0].top_logprobs] == [("z", -0.25), ("a", -0.5)]
    assert renderer.result().content == content
