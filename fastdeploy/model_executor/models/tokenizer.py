"""Byte-level tokenizer shared by the embedded models: ids 0..255 are bytes, then BOS, EOS, PAD."""
from __future__ import annotations

from collections.abc import Iterable

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 259


class ByteTokenizer:
    """UTF-8 bytes as token ids. `decode(encode(s)) == s` for every str `s`."""

    bos_token_id = BOS_ID
    eos_token_id = EOS_ID
    pad_token_id = PAD_ID
    vocab_size = VOCAB_SIZE

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text`, starting with BOS unless add_bos is False (the models were trained with it)."""
        if not isinstance(text, str):
            raise TypeError(f"ByteTokenizer.encode: argument 'text' must be str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the byte ids; special ids are dropped, invalid UTF-8 becomes U+FFFD."""
        if isinstance(ids, (list, tuple)):
            try:   # the common case, only byte ids (every streamed step decodes a few): one call into C
                return bytes(ids).decode("utf-8", errors="replace")
            except (TypeError, ValueError):
                pass   # a special id, or one to check: the path below
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < VOCAB_SIZE]
        if bad:
            raise ValueError(f"ByteTokenizer.decode: argument 'ids' has ids outside [0, {VOCAB_SIZE}): {bad[:8]}")
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def get_tokenizer(model: str) -> ByteTokenizer:
    """The tokenizer of an embedded model, without loading the model (both embedded models use bytes)."""
    if model not in ("fd-toy", "fd-tiny"):
        raise ValueError(f"get_tokenizer: argument 'model' must be 'fd-toy' or 'fd-tiny', got {model!r}")
    return ByteTokenizer()
