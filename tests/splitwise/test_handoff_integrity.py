"""Integrity tag and configuration hash (PD_MTP_FLOW §3 "Integrity / compatibility", PD_MTP_FLOW §5.2 step 1,
PD_MTP_FLOW §11 #10)."""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.splitwise import (
    PROTOCOL_VERSION,
    HandoffKey,
    HandoffSamplingParams,
    ReceiptCheck,
    Reject,
    check_receipt,
    config_hash,
    receive_handoff,
)

from .handoff_factory import KV_LAYOUT, MTP_CONFIG_HASH, forge, make_message


BASE_CONFIG = dict(model_name="fd-toy", vocab_size=64, num_speculative_tokens=1, mtp_model="fd-toy-mtp",
                   block_size=4, kv_dtype="float32")


def test_every_single_bit_flip_is_rejected_as_corrupted():
    """PD_MTP_FLOW §5.2 step 1: flipping any one bit anywhere in an encoded hand-off fails the request as corrupted.

    Exhaustive over every bit of a small message: flips in the prefix or header fail decoding or change a
    field; flips in the KV bytes change the content the tag covers. None yields Insert.
    """
    message = make_message(seed=10, num_prompt_tokens=2)
    data = bytearray(message.encode())
    for bit in range(len(data) * 8):
        data[bit // 8] ^= 1 << (bit % 8)
        verdict = receive_handoff(message.request_id, bytes(data), config_hash=MTP_CONFIG_HASH,
                                  num_speculative_tokens=1, kv_layout=KV_LAYOUT)
        data[bit // 8] ^= 1 << (bit % 8)
        assert isinstance(verdict, Reject) and verdict.check is ReceiptCheck.INTEGRITY, f"bit {bit}: {verdict}"
        assert "corrupted/mismatched hand-over" in verdict.error


def _changed_copies(message):
    kv = message.kv_target[0].copy()
    kv.reshape(-1).view(np.uint8)[0] ^= 1
    return {
        "request_id": forge(message, request_id="req-other"),
        "t0": forge(message, t0=message.t0 + 1),
        "draft_token_ids": forge(message, draft_token_ids=(message.t0, 10)),
        "kv bytes": forge(message, kv_target=(kv,) + message.kv_target[1:]),
        "kv shape": forge(message, kv_mtp=(message.kv_mtp[0].reshape(5, 3, 2),)),
        "prompt": forge(message, prompt_token_ids=message.prompt_token_ids[:-1] + (1,)),
        "sampling": forge(message, sampling=HandoffSamplingParams(max_tokens=17, eos_token_ids=(0,))),
        "config hash": forge(message, config_hash="0" * 32),
    }


@pytest.mark.parametrize("field", list(_changed_copies(make_message(seed=11))))
def test_tag_covers_every_field_and_the_kv_bytes(field):
    """PD_MTP_FLOW §3: the per-transfer tag covers request id, t0, draft ids, KV bytes (and shapes), and every other
    field."""
    message = make_message(seed=11)
    changed = _changed_copies(message)[field]
    assert changed.tag == message.tag
    assert changed.compute_tag() != message.tag
    verdict = check_receipt(changed, config_hash=changed.config_hash, num_speculative_tokens=1)
    assert isinstance(verdict, Reject) and verdict.check is ReceiptCheck.INTEGRITY
    assert "integrity tag" in verdict.error


def test_tag_is_deterministic():
    """The same content seals to the same tag, so D can recompute it."""
    assert make_message(seed=12).tag == make_message(seed=12).tag
    assert make_message(seed=12).tag != make_message(seed=13).tag


@pytest.mark.parametrize("field,value", [
    ("model_name", "fd-tiny"),
    ("vocab_size", 65),
    ("num_speculative_tokens", 2),
    ("mtp_model", "fd-toy-mtp-v2"),
    ("block_size", 8),
    ("kv_dtype", "float64"),
    ("protocol_version", PROTOCOL_VERSION + 1),
    ("transport", "mooncake-tcp"),
    ("transport", "mooncake-rdma"),
    ("max_model_len", 4096),
    ("tokenizer", "ByteTokenizer/300"),
    ("chat_template", "blake3:00ff"),
])
def test_config_hash_changes_with_every_field(field, value):
    """PD_MTP_FLOW §3: K, MTP model identity, block size, KV dtype, vocabulary, model, protocol version and the KV
    transport all count (a ZeroMQ P and a Mooncake D never pair); so do max_model_len, the tokenizer and the chat
    template, which decide the prompt ids one body becomes (docs/design.md §8)."""
    assert config_hash(**BASE_CONFIG) == config_hash(**BASE_CONFIG)
    assert config_hash(**{**BASE_CONFIG, field: value}) != config_hash(**BASE_CONFIG)


def test_config_hash_mismatch_is_rejected():
    """PD_MTP_FLOW §5.2 step 1 / PD_MTP_FLOW §11 #10: a hand-off from a P configured differently fails the request,
    never inserts."""
    message = make_message(seed=14)
    other = config_hash(**{**BASE_CONFIG, "num_speculative_tokens": 2})
    verdict = check_receipt(message, config_hash=other, num_speculative_tokens=2)
    assert isinstance(verdict, Reject) and verdict.check is ReceiptCheck.INTEGRITY
    assert "configuration hash" in verdict.error and message.request_id in verdict.error


@pytest.mark.parametrize("changes,fragment", [
    ({"num_speculative_tokens": 1, "mtp_model": None}, "'mtp_model' must be given exactly when"),
    ({"num_speculative_tokens": 0}, "'mtp_model' must be given exactly when"),
    ({"num_speculative_tokens": -1}, "'num_speculative_tokens' must be an int >= 0"),
    ({"block_size": 0}, "'block_size' must be an int > 0"),
    ({"vocab_size": True}, "'vocab_size' must be an int > 0"),
    ({"kv_dtype": ""}, "'kv_dtype' must be a non-empty str"),
    ({"transport": "ipc"}, "'transport' must be one of"),
])
def test_config_hash_rejects_inconsistent_arguments(changes, fragment):
    """Errors name the argument; an MTP model is named exactly when K >= 1."""
    with pytest.raises(ValueError, match=fragment):
        config_hash(**{**BASE_CONFIG, **changes})


KEY = HandoffKey.from_secret(b"s3cret")


def test_keyed_tag_verifies_only_with_the_same_secret():
    """PD_MTP_FLOW §3 (v2): with a PD secret the tag is keyed BLAKE3 with the key derived from it; D verifies it with
    its own key and rejects a hand-off sealed under another secret as corrupted/mismatched."""
    message = make_message(seed=20, key=KEY)
    assert message.keyed and message.tag != make_message(seed=20).tag
    ok = receive_handoff(message.request_id, message.encode(), config_hash=MTP_CONFIG_HASH,
                         num_speculative_tokens=1, key=HandoffKey.from_secret(b"s3cret"))
    assert not isinstance(ok, Reject), ok
    wrong = receive_handoff(message.request_id, message.encode(), config_hash=MTP_CONFIG_HASH,
                            num_speculative_tokens=1, key=HandoffKey.from_secret(b"other"))
    assert isinstance(wrong, Reject) and wrong.check is ReceiptCheck.INTEGRITY and "integrity tag" in wrong.error


@pytest.mark.parametrize("p_key,d_key,fragment", [
    (KEY, None, "sealed the hand-off with a PD secret and D has none"),
    (None, KEY, "sealed the hand-off without a PD secret and D has one"),
])
def test_keyed_and_unkeyed_sides_are_refused_naming_the_secret(p_key, d_key, fragment):
    """A P and a D of which only one has a PD secret: the hand-off fails at receipt step 1, naming the secret (a
    keyed D never accepts an unkeyed hand-off, whatever its tag)."""
    message = make_message(seed=21, key=p_key)
    verdict = check_receipt(message, config_hash=MTP_CONFIG_HASH, num_speculative_tokens=1, key=d_key)
    assert isinstance(verdict, Reject) and verdict.check is ReceiptCheck.INTEGRITY
    assert fragment in verdict.error and "FD_PD_SECRET" in verdict.error


def test_every_single_bit_flip_of_a_keyed_hand_off_is_rejected():
    """The keyed tag, like the unkeyed one, catches any one bit changed anywhere in the encoded hand-off."""
    message = make_message(seed=22, num_prompt_tokens=1, key=KEY)
    data = bytearray(message.encode())
    for bit in range(len(data) * 8):
        data[bit // 8] ^= 1 << (bit % 8)
        verdict = receive_handoff(message.request_id, bytes(data), config_hash=MTP_CONFIG_HASH,
                                  num_speculative_tokens=1, kv_layout=KV_LAYOUT, key=KEY)
        data[bit // 8] ^= 1 << (bit % 8)
        assert isinstance(verdict, Reject) and verdict.check is ReceiptCheck.INTEGRITY, f"bit {bit}: {verdict}"
