"""A checkpoint's `tokenizer.json` (the Hugging Face families: Qwen, Llama, ...), through the `tokenizers` library.

The library applies the file's normalizer, pre-tokenizer, model, added tokens and post-processor. BOS / EOS follow
`tokenizer_config.json`'s `add_bos_token` / `add_eos_token` when it has them (the post-processor is then left out
and the tokens are added here, so BOS is never doubled), else the file's post-processor.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

import tokenizers

from fastdeploy.tokenizer.base import Tokenizer
from fastdeploy.tokenizer.config import TokenizerConfig

TOKENIZER_FILE = "tokenizer.json"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's): each byte is one printable character; bytes that are printable
    Latin-1 characters stand for themselves, the others take the characters from U+0100 on, in byte order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    table, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(0x100 + shifted)] = byte
            shifted += 1
    return table


_BYTE_LEVEL = _byte_level_alphabet()


def _decoder_kinds(decoder: dict | None) -> set[str]:
    """The decoder types a tokenizer.json's `decoder` uses (a Sequence lists its parts)."""
    if not decoder:
        return set()
    kinds = {decoder.get("type")}
    for part in decoder.get("decoders") or ():
        kinds |= _decoder_kinds(part)
    return kinds


class HFTokenizer(Tokenizer):
    def __init__(self, path: Path, config: TokenizerConfig, model_vocab_size: int | None = None):
        try:
            text = path.read_text(encoding="utf-8")
            spec = json.loads(text)
            self._tk = tokenizers.Tokenizer.from_str(text)
        except Exception as error:   # OSError, bad JSON, and the library's own (plain) Exception
            raise ValueError(f"{path}: cannot load it with the tokenizers library "
                             f"({str(error).splitlines()[0] if str(error) else type(error).__name__})") from None
        tk = self._tk
        self._size = tk.get_vocab_size(with_added_tokens=True)
        self.vocab_size = max(self._size, model_vocab_size or 0)
        added = tk.get_added_tokens_decoder()
        self._added = {i: t.content for i, t in added.items() if not t.special}
        self._special_ids = {i for i, t in added.items() if t.special}
        self._special_ids |= {i for i in map(tk.token_to_id, config.special_strings) if i is not None}
        self._kinds = _decoder_kinds(spec.get("decoder"))
        self.bos_token_id = self._named_id(config, "bos_token", path)
        self.eos_token_id = self._named_id(config, "eos_token", path)
        self.pad_token_id = self._named_id(config, "pad_token", path, required=False)
        self._explicit = config.add_bos_token is not None or config.add_eos_token is not None
        if self._explicit:
            self.add_bos_token = bool(config.add_bos_token) and self.bos_token_id is not None
            self._add_eos = bool(config.add_eos_token) and self.eos_token_id is not None
        else:   # the post-processor decides; say what it does
            probe = tk.encode("a").ids
            self.add_bos_token = self.bos_token_id is not None and probe[:1] == [self.bos_token_id] \
                and tk.encode("a", add_special_tokens=False).ids[:1] != [self.bos_token_id]
            self._add_eos = False
        self.chat_template = config.chat_template
        self.special_tokens = dict(config.named)
        digest = hashlib.sha256(text.encode() + b"\0" + config.source).hexdigest()[:16]
        self.identity = f"tokenizers/{self.vocab_size}/{digest}"

    def _named_id(self, config: TokenizerConfig, name: str, where: Path, required: bool = True) -> int | None:
        content = config.named.get(name)
        if content is None:
            return None
        token_id = self._tk.token_to_id(content)
        if token_id is None and required:
            raise ValueError(f"{where.parent / 'tokenizer_config.json'}: field '{name}' is {content!r}, which is "
                             f"not in {where.name}")
        return token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode: argument 'text' must be str, got {type(text).__name__}")
        if not self._explicit:
            return self._tk.encode(text, add_special_tokens=add_special_tokens).ids
        ids = self._tk.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self.add_bos_token:
                ids.insert(0, self.bos_token_id)
            if self._add_eos:
                ids.append(self.eos_token_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = [i for i in self.check_ids(ids) if i < self._size and i not in self._special_ids]
        return self._tk.decode(ids, skip_special_tokens=False)

    def is_byte_token(self, token_id: int) -> bool:
        return "ByteFallback" in self._kinds and token_id < self._size \
            and _BYTE_PIECE.fullmatch(self._tk.id_to_token(token_id) or "") is not None

    def token_bytes(self, token_id: int) -> bytes | None:
        if token_id in self._special_ids or token_id >= self._size:
            return None
        if token_id in self._added:
            return self._added[token_id].encode()
        piece = self._tk.id_to_token(token_id)
        if "ByteLevel" in self._kinds:
            return bytes(_BYTE_LEVEL[c] for c in piece) if all(c in _BYTE_LEVEL for c in piece) else piece.encode()
        if self.is_byte_token(token_id):
            return bytes((int(piece[3:5], 16),))
        if "Metaspace" in self._kinds or "Replace" in self._kinds:
            return piece.replace("\u2581", " ").encode()
        return self._tk.decode([token_id], skip_special_tokens=False).encode()

    def token_piece(self, token_id: int) -> str:
        if token_id >= self._size:
            return f"<unused:{token_id}>"
        return self._tk.id_to_token(token_id)
