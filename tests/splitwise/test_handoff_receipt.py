"""D's receipt checks, one case per verdict and per ordering rule (PD_MTP_FLOW §5.2, I3, O4)."""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.splitwise import (
    FinishAtReceipt,
    Insert,
    KVLayout,
    ReceiptCheck,
    Reject,
    check_receipt,
    receive_handoff,
)

from .handoff_factory import (
    EOS,
    KV_LAYOUT,
    MTP_CONFIG_HASH,
    NO_SPEC_CONFIG_HASH,
    MTP_TAILS,
    TARGET_TAILS,
    forge,
    make_message,
)

T0 = 7


def _mtp(**kwargs):
    return make_message(seed=20, t0=kwargs.pop("t0", T0), **kwargs)


def _no_spec(**kwargs):
    return make_message(seed=21, t0=kwargs.pop("t0", T0), config=NO_SPEC_CONFIG_HASH, **kwargs)


# (case, message builder, K on D, expected verdict type, expected PD_MTP_FLOW §5.2 step, expected text fragment or
# reason)
RECEIPT_CASES = [
    ("MTP hand-off [t0, d1] is inserted", lambda: _mtp(), 1, Insert, ReceiptCheck.KV_READY, None),
    ("more than two draft ids are accepted", lambda: _mtp(draft_token_ids=(T0, 9, 11)), 1, Insert,
     ReceiptCheck.KV_READY, None),
    ("stop sequence [t0] is left to D's first round", lambda: _mtp(stop_seqs=[[T0]]), 1, Insert,
     ReceiptCheck.KV_READY, None),
    ("tag mismatch fails step 1", lambda: forge(_mtp(), t0=T0 + 1), 1, Reject, ReceiptCheck.INTEGRITY,
     "corrupted/mismatched hand-over: integrity tag"),
    ("config hash mismatch fails step 1", lambda: _mtp(config="f" * 32), 1, Reject, ReceiptCheck.INTEGRITY,
     "corrupted/mismatched hand-over: configuration hash"),
    ("step 1 comes before the draft-id check", lambda: forge(_mtp(), draft_token_ids=(T0,)), 1, Reject,
     ReceiptCheck.INTEGRITY, "integrity tag"),
    ("t0 = EOS finishes at receipt with reason stop", lambda: _mtp(t0=EOS, draft_token_ids=(EOS,)), 1,
     FinishAtReceipt, ReceiptCheck.TERMINATES, "stop"),
    ("t0 = a request stop_token_id finishes with reason stop",
     lambda: _mtp(eos_token_ids=(EOS, T0)), 1, FinishAtReceipt, ReceiptCheck.TERMINATES, "stop"),
    ("max_tokens = 1 finishes at receipt with reason length", lambda: _mtp(max_tokens=1), 1, FinishAtReceipt,
     ReceiptCheck.TERMINATES, "length"),
    ("EOS beats max_tokens = 1 for the reason", lambda: _mtp(t0=EOS, max_tokens=1), 1, FinishAtReceipt,
     ReceiptCheck.TERMINATES, "stop"),
    ("a terminating t0 needs neither d1 nor KV", lambda: _mtp(t0=EOS, draft_token_ids=(), with_kv=False), 1,
     FinishAtReceipt, ReceiptCheck.TERMINATES, "stop"),
    ("MTP with only [t0] is rejected", lambda: _mtp(draft_token_ids=(T0,)), 1, Reject, ReceiptCheck.DRAFT_IDS,
     "PD+MTP: request req-0 arrived from P with 1 draft id; 2 are required (first token + one MTP draft)"),
    ("MTP with no draft ids is rejected", lambda: _mtp(draft_token_ids=()), 1, Reject, ReceiptCheck.DRAFT_IDS,
     "PD+MTP: request req-0 arrived from P with 0 draft ids; 2 are required (first token + one MTP draft)"),
    ("MTP draft list must start with t0", lambda: _mtp(draft_token_ids=(9, 9)), 1, Reject,
     ReceiptCheck.DRAFT_IDS, "draft_token_ids[0] = 9, but the first token is 7"),
    ("no speculation with [t0] is inserted", lambda: _no_spec(draft_token_ids=(T0,)), 0, Insert,
     ReceiptCheck.KV_READY, None),
    ("no speculation with no draft ids is inserted", lambda: _no_spec(draft_token_ids=()), 0, Insert,
     ReceiptCheck.KV_READY, None),
    ("no speculation with [t0, d1] is rejected", lambda: _no_spec(draft_token_ids=(T0, 9)), 0, Reject,
     ReceiptCheck.DRAFT_IDS, "without speculation only [7] (the first token) or none are allowed"),
    ("a non-terminating t0 without KV is rejected", lambda: _mtp(with_kv=False), 1, Reject,
     ReceiptCheck.KV_READY, "without a KV payload"),
]


@pytest.mark.parametrize("case,build,k,verdict_type,check,expected", RECEIPT_CASES,
                         ids=[c[0] for c in RECEIPT_CASES])
def test_receipt_verdict_follows_spec_order(case, build, k, verdict_type, check, expected):
    """PD_MTP_FLOW §5.2: (1) tag + config hash, (2) t0 terminates, (3) draft ids, (4) insert — first deciding check
    wins."""
    message = build()
    config = MTP_CONFIG_HASH if k else NO_SPEC_CONFIG_HASH
    verdict = check_receipt(message, config_hash=config, num_speculative_tokens=k)
    assert type(verdict) is verdict_type
    assert verdict.check is check
    assert verdict.request_id == message.request_id
    if isinstance(verdict, FinishAtReceipt):
        assert verdict.token_ids == (message.t0,) and verdict.finish_reason == expected
    elif isinstance(verdict, Reject):
        assert expected in verdict.error and verdict.finish_reason == "abort"
    else:
        assert verdict.message is message


@pytest.mark.parametrize("layout,fragment", [
    (KVLayout(TARGET_TAILS[:1], MTP_TAILS, "float32"), "'kv_target' has 2 layers, D's cache has 1"),
    (KVLayout(TARGET_TAILS, ((2, 4),), "float32"), "'kv_mtp[0]' is float32[2, 3] per token"),
    (KVLayout(TARGET_TAILS, MTP_TAILS, "float64"), "D's cache layer is float64[2, 3]"),
    # a P with float32 KV and a D with bf16 KV: the receipt names the KV dtype, not only the bits' NumPy dtype
    (KVLayout(TARGET_TAILS, MTP_TAILS, "bfloat16"),
     "is float32[2, 3] per token, D's cache layer is bfloat16 (held as uint16)[2, 3]"),
])
def test_kv_layout_mismatch_is_a_step_one_failure(layout, fragment):
    """PD_MTP_FLOW §5.2 step 1: a payload D's cache cannot hold is a mismatched hand-over, caught before any slot is
    used."""
    verdict = check_receipt(_mtp(), config_hash=MTP_CONFIG_HASH, num_speculative_tokens=1, kv_layout=layout)
    assert isinstance(verdict, Reject) and verdict.check is ReceiptCheck.INTEGRITY
    assert fragment in verdict.error


def test_matching_kv_layout_is_inserted():
    """With D's own layout given, a well-formed payload passes all four checks."""
    verdict = check_receipt(_mtp(), config_hash=MTP_CONFIG_HASH, num_speculative_tokens=1, kv_layout=KV_LAYOUT)
    assert isinstance(verdict, Insert)


def test_undecodable_bytes_fail_the_enveloped_request():
    """Bytes that do not decode still fail the right request at once (step 1), not after its deadline."""
    verdict = receive_handoff("req-9", b"garbage", config_hash=MTP_CONFIG_HASH, num_speculative_tokens=1)
    assert isinstance(verdict, Reject) and verdict.check is ReceiptCheck.INTEGRITY
    assert verdict.request_id == "req-9" and "truncated" in verdict.error


def test_message_for_another_request_is_rejected():
    """A hand-off delivered under one request id but carrying another is a mismatched hand-over."""
    payload = _mtp().encode()
    verdict = receive_handoff("req-1", payload, config_hash=MTP_CONFIG_HASH, num_speculative_tokens=1)
    assert isinstance(verdict, Reject) and verdict.request_id == "req-1"
    assert "the message inside is for request req-0" in verdict.error


def test_received_insert_carries_bit_exact_kv():
    """An Insert from bytes hands D the exact KV P gathered (the D-side input of PD_MTP_FLOW §5.3)."""
    message = _mtp()
    verdict = receive_handoff(message.request_id, message.encode(), config_hash=MTP_CONFIG_HASH,
                              num_speculative_tokens=1, kv_layout=KV_LAYOUT)
    assert isinstance(verdict, Insert)
    for sent, got in zip(message.kv_target + message.kv_mtp, verdict.message.kv_target + verdict.message.kv_mtp):
        assert np.array_equal(sent.view(np.uint8), got.view(np.uint8))
    assert verdict.message.draft_token_ids[:2] == (T0, 9)
