"""A checkpoint's sentencepiece `tokenizer.model` (ERNIE-4.5's `Ernie4_5Tokenizer`), through the `sentencepiece`
library, as FastDeploy's own ERNIE tokenizer uses it.

The tokens `tokenizer_config.json` names (special tokens, `added_tokens_decoder`) are matched in the text first,
longest first, and each stretch between them is encoded by sentencepiece on its own (FastDeploy's and the
"legacy" transformers behaviour). BOS / EOS are added only when the config's `add_bos_token` / `add_eos_token`
say so (both default to false, as in Hugging Face's Ernie4_5Tokenizer).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

import sentencepiece

from fastdeploy.tokenizer.base import Tokenizer
from fastdeploy.tokenizer.config import TokenizerConfig

MODEL_FILE = "tokenizer.model"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class SentencePieceTokenizer(Tokenizer):
    def __init__(self, model_path: Path, config: TokenizerConfig, model_vocab_size: int | None = None):
        self._sp = sentencepiece.SentencePieceProcessor()
        try:
            data = model_path.read_bytes()
            self._sp.LoadFromSerializedProto(data)
        except (RuntimeError, OSError, TypeError) as error:
            raise ValueError(f"{model_path}: not a sentencepiece model ({str(error).splitlines()[0]})") from None
        sp, size = self._sp, self._sp.get_piece_size()
        self._size = size
        # added tokens beyond the sentencepiece vocabulary decode to their content
        self._beyond = {i: t.content for i, t in config.added.items() if i >= size}
        self.vocab_size = max([size, model_vocab_size or 0, *(i + 1 for i in self._beyond)])
        self._ids = {t.content: i for i, t in config.added.items()}
        specials = {}
        for content in config.special_strings:
            token_id = self._id_of(content)
            if token_id is not None:
                specials[content] = token_id
        self._special_ids = set(specials.values()) | {i for i in range(size)
                                                      if sp.is_control(i) or sp.is_unknown(i)}
        self.bos_token_id = self._named_id(config, "bos_token", sp.bos_id(), model_path)
        self.eos_token_id = self._named_id(config, "eos_token", sp.eos_id(), model_path)
        self.pad_token_id = self._named_id(config, "pad_token", sp.pad_id(), model_path, required=False)
        self.add_bos_token = bool(config.add_bos_token) and self.bos_token_id is not None
        self._add_eos = bool(config.add_eos_token) and self.eos_token_id is not None
        self.chat_template = config.chat_template
        self.special_tokens = dict(config.named)
        for name, token_id in (("bos_token", self.bos_token_id), ("eos_token", self.eos_token_id),
                               ("unk_token", sp.unk_id())):
            if name not in self.special_tokens and token_id is not None and 0 <= token_id < size:
                self.special_tokens[name] = sp.id_to_piece(token_id)
        matched = sorted({*self._ids, *specials}, key=len, reverse=True)
        self._splitter = re.compile("(" + "|".join(map(re.escape, matched)) + ")") if matched else None
        digest = hashlib.sha256(data + b"\0" + config.source).hexdigest()[:16]
        self.identity = f"sentencepiece/{self.vocab_size}/{digest}"

    def _id_of(self, content: str) -> int | None:
        if content in self._ids:
            return self._ids[content]
        token_id = self._sp.piece_to_id(content)
        if token_id == self._sp.unk_id() and content != self._sp.id_to_piece(token_id):
            return None   # not in the vocabulary
        return token_id

    def _named_id(self, config: TokenizerConfig, name: str, fallback: int, where: Path,
                  required: bool = True) -> int | None:
        """The id of a named special token: the config's spelling, else the sentencepiece model's own id."""
        content = config.named.get(name)
        if content is None:
            return fallback if fallback >= 0 else None
        token_id = self._id_of(content)
        if token_id is None and required:
            raise ValueError(f"{where.parent / 'tokenizer_config.json'}: field '{name}' is {content!r}, which is "
                             f"not in the vocabulary of {where.name}")
        return token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode: argument 'text' must be str, got {type(text).__name__}")
        ids = []
        parts = self._splitter.split(text) if self._splitter is not None else [text]
        for k, part in enumerate(parts):
            if k % 2:                      # a matched token (the splitter's group)
                ids.append(self._ids.get(part, self._sp.piece_to_id(part)))
            elif part:
                ids.extend(self._sp.encode(part))
        if add_special_tokens:
            if self.add_bos_token:
                ids.insert(0, self.bos_token_id)
            if self._add_eos:
                ids.append(self.eos_token_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = self.check_ids(ids)
        pieces, run = [], []
        for token_id in ids:
            if token_id in self._special_ids or (token_id >= self._size and token_id not in self._beyond):
                continue   # special, or an id no token was added for: no text
            if token_id in self._beyond:
                pieces.append(self._sp.decode(run))
                pieces.append(self._beyond[token_id])
                run = []
            else:
                run.append(token_id)
        pieces.append(self._sp.decode(run))
        return "".join(pieces)

    def is_byte_token(self, token_id: int) -> bool:
        return 0 <= token_id < self._size and self._sp.is_byte(token_id)

    def token_bytes(self, token_id: int) -> bytes | None:
        if token_id in self._beyond:
            return self._beyond[token_id].encode()
        if token_id in self._special_ids or token_id >= self._size:
            return None
        piece = self._sp.id_to_piece(token_id)
        if self._sp.is_byte(token_id):
            return bytes((int(_BYTE_PIECE.fullmatch(piece).group(1), 16),))
        return piece.replace("\u2581", " ").encode()

    def token_piece(self, token_id: int) -> str:
        if token_id in self._beyond:
            return self._beyond[token_id]
        return self._sp.id_to_piece(token_id) if token_id < self._size else f"<unused:{token_id}>"
