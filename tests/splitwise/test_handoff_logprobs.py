"""The hand-off's optional `t0_logprobs` header field (docs/design.md §6 decision 11, fastdeploy/splitwise/handoff.py):
absent unless given, an exact round trip when present, covered by the integrity tag, refused by name when
malformed, and carried by a receipt that finishes the request at t0 (PD_MTP_FLOW §5.2 step 2)."""

from __future__ import annotations

import inspect
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdeploy.schema.request import TokenLogprob
from fastdeploy.splitwise import FinishAtReceipt, HandoffDecodeError, HandoffMessage, Reject, check_receipt
from fastdeploy.splitwise.integrity import PROTOCOL_VERSION, canonical_json

from .handoff_factory import EOS, MTP_CONFIG_HASH, assert_same_message, make_message

_PREFIX = struct.Struct("<4sHI")
_KEYS = {"request_id", "prompt_token_ids", "sampling", "t0", "draft_token_ids", "config_hash", "keyed", "kv", "tag"}


def _with_logprobs(message: HandoffMessage, entry: TokenLogprob | None) -> HandoffMessage:
    """The message rebuilt with `t0_logprobs` and sealed again."""
    names = set(inspect.signature(HandoffMessage.create).parameters) - {"key", "t0_logprobs", "reused"}
    return HandoffMessage.create(**{name: getattr(message, name) for name in names}, t0_logprobs=entry)


def _header(data: bytes) -> tuple[dict, bytes]:
    _, _, length = _PREFIX.unpack_from(data, 0)
    return json.loads(data[_PREFIX.size:_PREFIX.size + length]), data[_PREFIX.size + length:]


def _rebuild(header: dict, body: bytes) -> bytes:
    raw = canonical_json(header)
    return _PREFIX.pack(b"FDPD", PROTOCOL_VERSION, len(raw)) + raw + body


_logprob = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
       st.lists(st.tuples(st.integers(0, 2**31 - 1), _logprob), max_size=20))
def test_t0_logprobs_round_trip_bit_for_bit(logprob, top):
    """D reads exactly P's floats (JSON's shortest repr round-trips every double, subnormals and -0.0 included),
    as one buffer and as frames."""
    entry = TokenLogprob(7, logprob, tuple(t for t, _ in top), tuple(v for _, v in top))
    message = _with_logprobs(make_message(), entry)
    for payload in (message.encode(), message.encode_frames()):
        decoded = HandoffMessage.decode(payload)
        assert_same_message(decoded, message)
        assert decoded.t0_logprobs == entry
        assert [struct.pack("<d", v) for v in decoded.t0_logprobs.top_logprobs] == \
            [struct.pack("<d", v) for v in entry.top_logprobs]


def test_t0_logprobs_are_absent_unless_given():
    """The field is additive: a message without logprobs has exactly the version-1 header keys, and decodes to
    t0_logprobs None."""
    message = make_message()
    header, _ = _header(message.encode())
    assert set(header) == _KEYS
    assert HandoffMessage.decode(message.encode()).t0_logprobs is None
    entry = TokenLogprob(7, -0.5, (7, 3), (-0.5, -1.25))
    header, _ = _header(_with_logprobs(message, entry).encode())
    assert set(header) == _KEYS | {"t0_logprobs"}
    assert header["t0_logprobs"] == {"logprob": -0.5, "top_token_ids": [7, 3], "top_logprobs": [-0.5, -1.25]}


def test_t0_logprobs_are_covered_by_the_integrity_tag():
    """Changing, adding or dropping t0's logprobs in transit is a PD_MTP_FLOW §5.2 step-1 failure."""
    entry = TokenLogprob(7, -0.5, (7, 3), (-0.5, -1.25))
    message = _with_logprobs(make_message(), entry)
    header, body = _header(message.encode())
    tampered = [{**header, "t0_logprobs": {**header["t0_logprobs"], "logprob": -0.25}},
                {k: v for k, v in header.items() if k != "t0_logprobs"}]
    plain_header, plain_body = _header(make_message().encode())
    tampered_plain = {**plain_header, "t0_logprobs": header["t0_logprobs"]}
    for forged in (_rebuild(tampered[0], body), _rebuild(tampered[1], body), _rebuild(tampered_plain, plain_body)):
        verdict = check_receipt(HandoffMessage.decode(forged), config_hash=MTP_CONFIG_HASH, num_speculative_tokens=1)
        assert isinstance(verdict, Reject) and "integrity tag" in verdict.error


@pytest.mark.parametrize("value,why", [
    ({"logprob": -1.0, "top_token_ids": [1]}, "t0_logprobs"),
    ({"logprob": -1.0, "top_token_ids": [1], "top_logprobs": [-1.0], "rank": 1}, "t0_logprobs"),
    ({"logprob": -1.0, "top_token_ids": [1, 2], "top_logprobs": [-1.0]}, "top_token_ids"),
    ({"logprob": 0.5, "top_token_ids": [], "top_logprobs": []}, "logprob"),
    ({"logprob": "x", "top_token_ids": [], "top_logprobs": []}, "logprob"),
    ({"logprob": -1.0, "top_token_ids": ["a"], "top_logprobs": [-1.0]}, "top_token_ids"),
    ({"logprob": -1.0, "top_token_ids": 3, "top_logprobs": [-1.0]}, "t0_logprobs"),
    ({"logprob": -1.0, "top_token_ids": list(range(21)), "top_logprobs": [-1.0] * 21}, "t0_logprobs"),
    ([-1.0], "t0_logprobs"),
])
def test_malformed_t0_logprobs_are_refused_naming_the_field(value, why):
    header, body = _header(make_message().encode())
    with pytest.raises(HandoffDecodeError, match=why):
        HandoffMessage.decode(_rebuild({**header, "t0_logprobs": value}, body))


def test_t0_logprobs_must_describe_t0():
    with pytest.raises(ValueError, match="t0_logprobs"):
        _with_logprobs(make_message(t0=7), TokenLogprob(8, -0.5))


def test_receipt_finishing_at_t0_carries_its_logprobs():
    """t0 = EOS or max_tokens 1 ends the request at receipt with [t0]; its logprobs go with it."""
    entry = TokenLogprob(EOS, -0.125, (EOS,), (-0.125,))
    stops = _with_logprobs(make_message(t0=EOS, draft_token_ids=(EOS, 9)), entry)
    verdict = check_receipt(stops, config_hash=MTP_CONFIG_HASH, num_speculative_tokens=1)
    assert isinstance(verdict, FinishAtReceipt) and verdict.t0_logprobs == entry
    one = _with_logprobs(make_message(max_tokens=1), TokenLogprob(7, -0.5))
    verdict = check_receipt(one, config_hash=MTP_CONFIG_HASH, num_speculative_tokens=1)
    assert isinstance(verdict, FinishAtReceipt) and verdict.t0_logprobs == TokenLogprob(7, -0.5)
