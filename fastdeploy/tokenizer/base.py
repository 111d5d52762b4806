"""The tokenizer interface every part of the serving stack uses (docs/serving.md, "Tokenizer").

Prompts, stop strings, `/tokenize`, logprobs, the chat template's variables and streaming detokenization all go
through `Tokenizer`, so an embedded model's byte tokenizer and a checkpoint's sentencepiece or `tokenizers` vocabulary
are interchangeable. Importable without Paddle (the API server imports it).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable


class Tokenizer(ABC):
    """Text <-> token ids of one model.

    `encode(text, add_special_tokens=True)` adds BOS (or EOS) only where the model's tokenizer config asks for it
    (`add_bos_token`); `decode` skips special tokens; `token_text` / `token_bytes` / `token_piece` describe one token
    for logprobs and `/tokenize`. `special_tokens` are the chat template's variables (`bos_token`, `eos_token`, ...).
    """

    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    add_bos_token: bool                 # encode(..., add_special_tokens=True) starts with BOS
    chat_template: str | None           # the model's own Jinja chat template, None when it ships none
    special_tokens: dict[str, str]      # template variables: bos_token, eos_token, pad_token, ... (as spelled)
    identity: str                       # names the vocabulary (PD's compatibility hash: P and D must agree)

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special-token spellings in the text become their ids."""

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of the ids, special tokens skipped; bytes that are no complete UTF-8 character become U+FFFD."""

    @abstractmethod
    def token_bytes(self, token_id: int) -> bytes | None:
        """The bytes one token adds to the text when it follows other text (a sentencepiece `▁` is a space even
        at the start); None for a special token, which adds none."""

    @abstractmethod
    def token_piece(self, token_id: int) -> str:
        """The token as the vocabulary spells it (`▁Hello`, `Ġworld`, `<0xE4>`, `</s>`): /tokenize's token_strs."""

    def token_text(self, token_id: int) -> str:
        """The text of one token in a logprobs object: its characters when its bytes are whole UTF-8 characters,
        else its bytes as `<0xNN>` (a piece of a multi-byte character); a special token's spelling. Distinct ids
        get distinct texts, so {text: logprob} maps lose nothing."""
        data = self.token_bytes(token_id)
        if data is None:
            return self.token_piece(token_id)
        if self.is_byte_token(token_id):
            return f"<0x{data[0]:02X}>"
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "".join(f"<0x{b:02X}>" for b in data)

    def is_byte_token(self, token_id: int) -> bool:
        """A byte-fallback token (`<0xNN>`): spelled by its byte in logprobs, even when the byte is ASCII, because
        a vocabulary can hold both `<0x20>` and `▁`."""
        return False

    def check_ids(self, ids: Iterable[int], what: str = "ids") -> list[int]:
        """`ids` as ints, ValueError naming the first one outside the vocabulary."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"{type(self).__name__}.decode: argument '{what}' has ids outside "
                             f"[0, {self.vocab_size}): {bad[:8]}")
        return ids
