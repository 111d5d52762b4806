"""`get_tokenizer(name_or_path)`: the tokenizer of an embedded model name or of a checkpoint directory."""
from __future__ import annotations

import json
import re
from pathlib import Path

from fastdeploy.tokenizer.base import Tokenizer
from fastdeploy.tokenizer.byte import ByteTokenizer
from fastdeploy.tokenizer.config import read_tokenizer_config
from fastdeploy.tokenizer.hf_tokenizer import TOKENIZER_FILE
from fastdeploy.tokenizer.sp_tokenizer import MODEL_FILE

EMBEDDED_MODELS = ("fd-tiny", "fd-toy")
# tokenizer classes whose checkpoints are read through tokenizer.model even when a tokenizer.json is there too
SENTENCEPIECE_CLASSES = ("Ernie4_5Tokenizer",)


def _model_vocab_size(directory: Path) -> int | None:
    """config.json's vocab_size: the model's embedding can be larger than the vocabulary (padded), and the ids
    past the vocabulary are valid ids without text."""
    try:
        value = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None   # the checkpoint reader reports a bad config.json; the tokenizer does not need it
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def no_such_model(name: str) -> str:
    """Why `name` names no model here; a hub id ("org/name") gets how to get the directory (nothing is
    downloaded: only local directories are read)."""
    if re.fullmatch(r"[\w-][\w.-]*/[\w.-]+", name):
        return (f"no such directory, and only local checkpoint directories are read (nothing is downloaded): if "
                f"this is a model hub id, download it first (e.g. `huggingface-cli download {name} --local-dir "
                f"{name.split('/')[1]}`) and pass the directory")
    return f"not a checkpoint directory (no such directory) and not an embedded model ({', '.join(EMBEDDED_MODELS)})"


def get_tokenizer(name_or_path: str) -> Tokenizer:
    """"fd-tiny" / "fd-toy": the byte tokenizer; a checkpoint directory: the tokenizer it ships (sentencepiece
    `tokenizer.model` for Ernie4_5Tokenizer, else `tokenizer.json`, else `tokenizer.model`, with
    `tokenizer_config.json`). ValueError of one line naming the directory and what is missing or wrong."""
    if name_or_path in EMBEDDED_MODELS:
        return ByteTokenizer()
    directory = Path(name_or_path)
    if not directory.is_dir():
        raise ValueError(f"{name_or_path}: {no_such_model(name_or_path)}")
    config = read_tokenizer_config(directory)
    model_file, json_file = directory / MODEL_FILE, directory / TOKENIZER_FILE
    vocab = _model_vocab_size(directory)
    if model_file.is_file() and (config.tokenizer_class in SENTENCEPIECE_CLASSES or not json_file.is_file()):
        from fastdeploy.tokenizer.sp_tokenizer import SentencePieceTokenizer
        return SentencePieceTokenizer(model_file, config, vocab)
    if json_file.is_file():
        from fastdeploy.tokenizer.hf_tokenizer import HFTokenizer
        return HFTokenizer(json_file, config, vocab)
    raise ValueError(f"{directory}: no tokenizer: the directory has neither {TOKENIZER_FILE} nor {MODEL_FILE} "
                     "(with tokenizer_config.json)")
