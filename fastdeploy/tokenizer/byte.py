"""The embedded models' tokenizer: ids 0..255 are UTF-8 bytes, then BOS, EOS, PAD."""
from __future__ import annotations

from collections.abc import Iterable

from fastdeploy.tokenizer.base import Tokenizer

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 259
_SPECIAL_NAMES = {BOS_ID: "<|bos|>", EOS_ID: "<|eos|>", PAD_ID: "<|pad|>"}


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as token ids. `decode(encode(s)) == s` for every str `s`. The embedded models were trained with
    BOS first, so `encode` adds it; the special tokens have no text form (the built-in chat template's
    `bos_token` and the others are empty strings)."""

    bos_token_id = BOS_ID
    eos_token_id = EOS_ID
    pad_token_id = PAD_ID
    vocab_size = VOCAB_SIZE
    add_bos_token = True
    chat_template = None
    identity = f"ByteTokenizer/{VOCAB_SIZE}"

    def __init__(self):
        self.special_tokens = {"bos_token": "", "eos_token": "", "pad_token": ""}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"ByteTokenizer.encode: argument 'text' must be str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_special_tokens else ids

    def decode(self, ids: Iterable[int]) -> str:
        if isinstance(ids, (list, tuple)):
            try:   # the common case, only byte ids (every streamed step decodes a few): one call into C
                return bytes(ids).decode("utf-8", errors="replace")
            except (TypeError, ValueError):
                pass   # a special id, or one to check: the path below
        ids = self.check_ids(ids)
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes | None:
        return bytes((token_id,)) if 0 <= token_id < 256 else None

    def token_piece(self, token_id: int) -> str:
        """A printable ASCII byte as itself, other bytes as `<0xNN>`, `<|bos|>` / `<|eos|>` / `<|pad|>`."""
        if token_id in _SPECIAL_NAMES:
            return _SPECIAL_NAMES[token_id]
        return chr(token_id) if 0x20 <= token_id < 0x7f else f"<0x{token_id:02X}>"

    def token_text(self, token_id: int) -> str:
        """An ASCII byte as its character, other bytes as `<0xNN>` (none is a character by itself)."""
        if token_id in _SPECIAL_NAMES:
            return _SPECIAL_NAMES[token_id]
        return chr(token_id) if token_id < 0x80 else f"<0x{token_id:02X}>"
