"""Tokenizers of the served models (docs/serving.md, "Tokenizer"): the `Tokenizer` interface, the embedded models'
byte tokenizer, and a checkpoint's own (sentencepiece or `tokenizers`), through `get_tokenizer`. No Paddle."""
from fastdeploy.tokenizer.base import Tokenizer
from fastdeploy.tokenizer.byte import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer
from fastdeploy.tokenizer.loader import EMBEDDED_MODELS, get_tokenizer

__all__ = ["Tokenizer", "ByteTokenizer", "get_tokenizer", "EMBEDDED_MODELS", "BOS_ID", "EOS_ID", "PAD_ID",
           "VOCAB_SIZE"]
