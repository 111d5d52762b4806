"""The models' tokenizers (contract item 1): `get_tokenizer(name_or_path)` and the `Tokenizer` interface, defined
in the `fastdeploy.tokenizer` package (no Paddle) and re-exported here for the model code."""
from fastdeploy.tokenizer import (BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer, Tokenizer,  # noqa: F401
                                  get_tokenizer)

__all__ = ["Tokenizer", "ByteTokenizer", "get_tokenizer", "BOS_ID", "EOS_ID", "PAD_ID", "VOCAB_SIZE"]
