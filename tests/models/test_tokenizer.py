"""Byte tokenizer shared by the embedded models (docs/models.md, "Embedded models")."""
import pytest
from hypothesis import given, settings, strategies as st

from fastdeploy.model_executor.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.text())
def test_decode_inverts_encode_for_any_text(text):
    """decode(encode(s)) == s for every str, and encode starts with BOS."""
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids[0] == BOS_ID and all(0 <= i < 256 for i in ids[1:])
    assert tok.decode(ids) == text


def test_special_ids_are_dropped_by_decode():
    """BOS/EOS/PAD never appear as text."""
    tok = ByteTokenizer()
    assert tok.decode([BOS_ID, ord("h"), EOS_ID, ord("i"), PAD_ID]) == "hi"
    assert VOCAB_SIZE == 259


def test_decode_takes_any_sequence_of_integer_ids():
    """Lists, tuples, generators and NumPy integers decode alike (the all-bytes fast path and the checked path)."""
    import numpy as np
    tok = ByteTokenizer()
    for ids in ([104, 105], (104, 105), iter([104, 105]), list(np.array([104, 105])), [104, EOS_ID, 105]):
        assert tok.decode(ids) == "hi"
    assert tok.decode([0xE2, 0x82]) == "\ufffd" and tok.decode([]) == ""
    with pytest.raises(ValueError, match="'ids'.*-1"):
        tok.decode([104, -1])


def test_out_of_vocabulary_id_is_rejected_with_its_value():
    """decode names the argument and the bad id."""
    with pytest.raises(ValueError, match="'ids'.*300"):
        ByteTokenizer().decode([1, 300])
