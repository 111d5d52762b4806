"""Wire format of the P→D hand-off (PD_MTP_FLOW §3): bit-exact round trip and clear errors on bad bytes."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdeploy.splitwise import PROTOCOL_VERSION, HandoffDecodeError, HandoffMessage, HandoffSamplingParams
from fastdeploy.splitwise.integrity import canonical_json

from .handoff_factory import assert_same_message, make_message


_PREFIX = struct.Struct("<4sHI")
_KV_DTYPES = ["float16", "float32", "float64", "uint16", "int8", "int32", "bool", ">f4"]


def _split(data: bytes) -> tuple[bytes, int, dict, bytes]:
    magic, version, header_len = _PREFIX.unpack_from(data, 0)
    header = json.loads(data[_PREFIX.size:_PREFIX.size + header_len])
    return magic, version, header, data[_PREFIX.size + header_len:]


def _join(magic: bytes, version: int, header: dict, body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return _PREFIX.pack(magic, version, len(raw)) + raw + body


@st.composite
def _kv_arrays(draw, num_tokens: int) -> tuple[np.ndarray, ...]:
    arrays = []
    for _ in range(draw(st.integers(0, 3))):
        dtype = np.dtype(draw(st.sampled_from(_KV_DTYPES)))
        tail = draw(st.lists(st.integers(0, 4), max_size=2))
        raw = draw(st.binary(min_size=num_tokens * int(np.prod(tail, dtype=np.int64)) * dtype.itemsize,
                             max_size=num_tokens * int(np.prod(tail, dtype=np.int64)) * dtype.itemsize))
        array = np.frombuffer(raw, dtype=np.uint8).view(dtype).reshape((num_tokens, *tail)) \
            if dtype != np.bool_ else (np.frombuffer(raw, dtype=np.uint8) & 1).astype(np.bool_).reshape(
                (num_tokens, *tail))
        arrays.append(array)
    return tuple(arrays)


@st.composite
def _messages(draw) -> HandoffMessage:
    ids = st.integers(0, 2**31 - 1)
    prompt = draw(st.lists(ids, min_size=1, max_size=40))
    sampling = HandoffSamplingParams(
        max_tokens=draw(st.integers(1, 4096)),
        min_tokens=draw(st.integers(0, 1)),
        stop_seqs=draw(st.lists(st.lists(ids, min_size=1, max_size=4), max_size=3)),
        eos_token_ids=draw(st.lists(ids, max_size=3)),
        temperature=draw(st.floats(0, 2, allow_nan=False)),
        top_p=draw(st.floats(0, 1, allow_nan=False, exclude_min=True)),
        seed=draw(st.none() | st.integers(0, 2**63 - 1)),
        logprobs=draw(st.none() | st.integers(0, 20)),
    )
    t0 = draw(ids)
    return HandoffMessage.create(
        request_id=draw(st.text(min_size=1, max_size=20)),
        prompt_token_ids=prompt,
        sampling=sampling,
        t0=t0,
        draft_token_ids=draw(st.lists(ids, max_size=4)),
        kv_target=draw(_kv_arrays(len(prompt))),
        kv_mtp=draw(_kv_arrays(len(prompt))),
        config_hash=draw(st.text(max_size=32)),
    )


@settings(derandomize=True, max_examples=60, deadline=None)
@given(_messages())
def test_encode_decode_round_trip_is_bit_exact(message):
    """PD_MTP_FLOW §3: D sees exactly what P sent: every field equal, every KV array bit-identical (NaN bit patterns
    too)."""
    decoded = HandoffMessage.decode(message.encode())
    assert_same_message(message, decoded)
    assert decoded.compute_tag() == decoded.tag


def test_round_trip_without_kv_payload():
    """PD_MTP_FLOW §4.4: P MAY skip the KV transfer when t0 terminates; such a message still round-trips."""
    message = make_message(seed=1, t0=0, draft_token_ids=(0,), with_kv=False)
    decoded = HandoffMessage.decode(message.encode())
    assert_same_message(message, decoded)
    assert not decoded.has_kv


def test_decoded_kv_arrays_are_read_only_views():
    """Decoding never lets D write through to the received bytes by accident."""
    for data in (make_message(seed=2).encode(), bytearray(make_message(seed=2).encode())):
        decoded = HandoffMessage.decode(data)
        assert all(not a.flags.writeable for a in decoded.kv_target + decoded.kv_mtp)


@pytest.mark.parametrize("version", [1, PROTOCOL_VERSION + 1], ids=["v1-peer", "newer-peer"])
def test_decode_rejects_another_protocol_version_naming_both(version):
    """PD_MTP_FLOW §3 compatibility: a hand-off of another wire format version (a P still on v1) is refused before
    anything else is parsed, with an error naming its version and this build's."""
    magic, _, header, body = _split(make_message(seed=3).encode())
    with pytest.raises(HandoffDecodeError,
                       match=rf"wire format version {version}; this build reads version {PROTOCOL_VERSION}"):
        HandoffMessage.decode(_join(magic, version, header, body))


def test_decode_rejects_bad_magic():
    """Bytes that are not a hand-off at all are refused by the magic number."""
    data = make_message(seed=4).encode()
    with pytest.raises(HandoffDecodeError, match="bad magic"):
        HandoffMessage.decode(b"XXXX" + data[4:])


def test_decode_rejects_every_truncation():
    """Truncated data at any length is an error, never a shorter message or a crash."""
    data = make_message(seed=5).encode()
    for length in range(len(data)):
        with pytest.raises(HandoffDecodeError, match="truncated|not valid JSON"):
            HandoffMessage.decode(data[:length])


def test_decode_rejects_trailing_bytes():
    """Extra bytes after the KV payload mean the header and the body disagree."""
    with pytest.raises(HandoffDecodeError, match="trailing bytes"):
        HandoffMessage.decode(make_message(seed=6).encode() + b"\x00")


def _mutate(header: dict, path: tuple, value) -> dict:
    node = header
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return header


MALFORMED_HEADERS = [
    # (case, path in the header, new value or KeyError to delete, expected message fragment)
    ("object dtype smuggled in", ("kv", "target", 0, "dtype"), "|O", "not a numeric dtype"),
    ("structured dtype", ("kv", "target", 0, "dtype"), "f4,i4", "not a numeric dtype"),
    ("unknown dtype name", ("kv", "mtp", 0, "dtype"), "nonsense", "not a numeric dtype"),
    ("text numpy would parse", ("kv", "mtp", 0, "dtype"), "(2,)<f4", "not a numeric dtype"),
    ("native order instead of '<'", ("kv", "mtp", 0, "dtype"), "=f4", "not a numeric dtype"),
    ("float128", ("kv", "mtp", 0, "dtype"), "<f16", "not a numeric dtype"),
    ("negative dimension", ("kv", "target", 1, "shape"), [5, -2, 3], "list of ints >= 0"),
    ("shape wider than the body", ("kv", "mtp", 0, "shape"), [5, 2, 300], "truncated"),
    ("huge forged shape", ("kv", "mtp", 0, "shape"), [2**62, 2**62], "truncated"),
    ("missing t0", ("t0",), KeyError, "header must have keys"),
    ("t0 as a float", ("t0",), 7.0, "'t0' must be an int"),
    ("negative prompt token", ("prompt_token_ids", 0), -1, "'prompt_token_ids\\[0\\]' must be >= 0"),
    ("bool as a token id", ("draft_token_ids", 1), True, "'draft_token_ids\\[1\\]' must be an int"),
    ("max_tokens zero", ("sampling", "max_tokens"), 0, "'max_tokens' must be an int >= 1"),
    ("unknown sampling key", ("sampling", "penalty"), 1.0, "'sampling' must have keys"),
    ("request id not a string", ("request_id",), 12, "'request_id' must be a non-empty str"),
]


@pytest.mark.parametrize("case,path,value,fragment", MALFORMED_HEADERS, ids=[c[0] for c in MALFORMED_HEADERS])
def test_decode_rejects_malformed_header_with_the_field_named(case, path, value, fragment):
    """A well-framed message with a bad header field fails with HandoffDecodeError naming the field."""
    magic, version, header, body = _split(make_message(seed=7).encode())
    with pytest.raises(HandoffDecodeError, match=fragment):
        HandoffMessage.decode(_join(magic, version, _mutate(header, path, value), body))


def test_decode_rejects_a_non_canonical_header():
    """Equal values spelled differently (here: spaces after separators) are refused, so that every change to the
    header bytes changes a decoded value and hence the integrity tag."""
    magic, version, header, body = _split(make_message(seed=9).encode())
    raw = json.dumps(header, sort_keys=True).encode()  # default separators put spaces after ',' and ':'
    with pytest.raises(HandoffDecodeError, match="not in canonical form"):
        HandoffMessage.decode(_PREFIX.pack(magic, version, len(raw)) + raw + body)


def test_message_fields_are_validated_at_construction():
    """P cannot build an inconsistent message: KV rows must equal the prompt length; errors name the field."""
    message = make_message(seed=8)
    with pytest.raises(ValueError, match=r"'kv_target\[0\]' must have shape \[n, ...\] with n = 5"):
        HandoffMessage.create(request_id="r", prompt_token_ids=message.prompt_token_ids, sampling=message.sampling,
                              t0=1, draft_token_ids=(1, 2), kv_target=(np.zeros((4, 2)),), kv_mtp=(),
                              config_hash="h")
    with pytest.raises(ValueError, match="'kv_mtp\\[0\\]' must have a bool, int, uint or float dtype"):
        HandoffMessage.create(request_id="r", prompt_token_ids=(1,), sampling=message.sampling, t0=1,
                              draft_token_ids=(), kv_target=(), kv_mtp=(np.array(["x"], dtype=object),),
                              config_hash="h")
    with pytest.raises(ValueError, match="HandoffSamplingParams: field 'top_p' must be in"):
        HandoffSamplingParams(max_tokens=4, top_p=float("nan"))
    with pytest.raises(ValueError, match="field 'stop_seqs' must not contain an empty sequence"):
        HandoffSamplingParams(max_tokens=4, stop_seqs=[[]])


def _packed(message: HandoffMessage) -> list[bytes]:
    """The message's frames with all KV arrays in one frame, as P sends a hand-off gathered into one buffer."""
    frames = message.encode_frames()
    return [bytes(frames[0]), b"".join(bytes(f) for f in frames[1:])]


def test_kv_frames_may_hold_several_whole_arrays():
    """Framed form: the KV frames are the KV bytes cut at array boundaries, any grouping; a grouping decodes to the
    same message, its arrays are views of the frames."""
    message = make_message(seed=30)
    frames = _packed(message)
    decoded = HandoffMessage.decode(frames)
    assert_same_message(decoded, message)
    assert all(np.shares_memory(a, np.frombuffer(frames[1], np.uint8)) for a in decoded.kv_target + decoded.kv_mtp)
    first, rest = message.encode_frames()[1], b"".join(bytes(f) for f in message.encode_frames()[2:])
    assert_same_message(HandoffMessage.decode([frames[0], bytes(first), rest]), message)


@pytest.mark.parametrize("cut,fragment", [
    (lambda kv: [kv[:7], kv[7:]], "truncated message"),               # an array split across frames
    (lambda kv: [kv, b"\x00"], "bytes after the described arrays"),    # an extra frame
    (lambda kv: [kv[:-4]], "truncated message"),                       # a short frame
    (lambda kv: [kv, b""], "an empty KV frame"),
])
def test_kv_frames_cut_inside_an_array_or_with_extra_bytes_are_refused(cut, fragment):
    """A frame boundary inside an array, an extra or empty frame, or missing bytes: refused, never misread."""
    header, kv = _packed(make_message(seed=31))
    with pytest.raises(HandoffDecodeError, match=fragment):
        HandoffMessage.decode([header, *cut(kv)])


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_tagged_header_is_the_canonical_json_of_every_field(seed):
    """The header P sends is exactly the canonical JSON of every field with the tag, so the tag (over the same
    JSON without it) and D's canonical-form check read the same bytes."""
    message = make_message(seed=seed % 1000, num_prompt_tokens=1 + seed % 7)
    expected = canonical_json(message._header(with_tag=True))
    assert message._tagged_header() == expected
    assert message.canonical_header() == canonical_json(message._header(with_tag=False))
