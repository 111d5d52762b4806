"""Hand-made connector frames for the tests that play a rogue or outdated peer (SERVICES §7), and the catalogue of
hostile messages the hostile-peer batteries send to P's connector port and, as P, to D.

A catalogue entry is (name, frames, reason): the frames of one message (a DEALER's, so no identity frame) and the
reason (peer_message.REFUSE_REASONS) the receiver must refuse it with. Entries that a peer without the secret can
tag correctly (`well_formed`) are refused as `bad_tag` by a receiver that has a secret, since such a peer tags
them without the key.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from fastdeploy.splitwise.integrity import PROTOCOL_VERSION, canonical_json
from fastdeploy.splitwise.peer_message import header_frame
from fastdeploy.splitwise.peer_auth import CurveKeys
from fastdeploy.splitwise.secret import MessageTagger

NONCE = "0123456789abcdef" * 2
DEEP = 100_000        # nesting far past any recursion limit (a body frame)
DEEP_HEADER = 1_000   # nesting at Python's recursion limit that still fits a header frame's 2048 bytes


def header(kind: str, request_id: str, nonce: str, frames=(), secret: bytes | None = None) -> bytes:
    """A correctly tagged header frame for a message with body `frames` (keyed when `secret` is given)."""
    return header_frame(MessageTagger(secret), kind, request_id, nonce, list(frames))


def holding_secret(socket, secret: bytes | None, server: bool = False):
    """`socket` as a peer that completes the connector's handshake with `secret` (peer_auth.py: a CURVE client, or
    server, with its keys): a rogue that got past the transport's authentication, so that what it sends reaches
    the message checks behind it. Unchanged without a secret."""
    if secret is not None:
        keys = CurveKeys.from_secret(secret)
        keys.make_server(socket) if server else keys.make_client(socket)
    return socket


def nonce_of(frame) -> str:
    """The nonce in a received header frame."""
    return json.loads(bytes(frame))["nonce"]


def raw_header(**fields) -> bytes:
    """A header frame with exactly `fields` (version added unless given; no tag computed unless given)."""
    return canonical_json({"v": PROTOCOL_VERSION, **fields})


def tagged(kind: str, rid: str, nonce: str = NONCE, body=(), **overrides) -> bytes:
    """A header tagged without a key over `fields` (the tag an attacker without the secret can compute), with
    some fields replaced afterwards (the tag then no longer matches them)."""
    fields = json.loads(header(kind, rid, nonce, body))
    return canonical_json({**fields, **overrides})


@dataclass(frozen=True)
class Hostile:
    name: str
    frames: list[bytes]
    reason: str
    well_formed: bool = False   # correctly tagged without a key: `bad_tag` where the receiver has a secret

    def reason_with(self, keyed: bool) -> str:
        return "bad_tag" if keyed and self.well_formed else self.reason


def _nonce(i: int) -> str:
    return f"{i:032x}"


def _deep(prefix: bytes, suffix: bytes = b"", depth: int = DEEP_HEADER) -> bytes:
    return prefix + b"[" * depth + b"]" * depth + suffix


def malformed_headers(rid: str) -> list[Hostile]:
    """Headers refused before any tag is checked: not JSON, wrong shape or types, too deep, too big."""
    ok = {"kind": "reserve", "request_id": rid, "tag": "00" * 16, "nonce": NONCE}
    cases = [
        ("empty frame", b""), ("not UTF-8", b"\xff\xfe\xfd"), ("not JSON", b"not json"), ("array", b"[]"),
        ("null", b"null"), ("empty object", b"{}"), ("kind only", b'{"kind":"reserve"}'),
        ("kind list", raw_header(**{**ok, "kind": []})), ("kind object", raw_header(**{**ok, "kind": {}})),
        ("kind number", raw_header(**{**ok, "kind": 5})),
        ("deep kind", _deep(b'{"kind":', b',"request_id":"x","tag":"","v":2}')),
        ("deep unknown field", _deep(b'{"kind":"reserve","x":', b"}")), ("deep array", _deep(b"")),
        ("request id empty", raw_header(**{**ok, "request_id": ""})),
        ("request id too long", raw_header(**{**ok, "request_id": "r" * 600})),
        ("request id number", raw_header(**{**ok, "request_id": 12})),
        ("request id null", raw_header(**{**ok, "request_id": None})),
        ("tag number", raw_header(**{**ok, "tag": 5})), ("tag too long", raw_header(**{**ok, "tag": "a" * 200})),
        ("version text", raw_header(**{**ok, "v": "2"})), ("version bool", raw_header(**{**ok, "v": True})),
        ("version float", raw_header(**{**ok, "v": 1.5})), ("extra field", raw_header(**{**ok, "x": 1})),
        ("nonce too long", raw_header(**{**ok, "nonce": "a" * 40})),
        ("overlong UTF-8", b'{"kind":"\xc0\xaf"}'), ("NaN", b'{"kind":"reserve","v":NaN}'),
    ]
    return [Hostile(name, [frame], "malformed") for name, frame in cases] + [
        Hostile("header too big", [b"{" + b" " * 3000 + b"}"], "oversized"),
        Hostile("version 1", [raw_header(**{**ok, "v": 1})], "version"),
        Hostile("version 99", [raw_header(**{**ok, "v": 99})], "version"),
        Hostile("version huge", [raw_header(**{**ok, "v": 2 ** 70})], "version"),
        Hostile("unknown kind", [raw_header(**{**ok, "kind": "steal"})], "unknown_kind"),
    ]


def to_p(rid: str) -> list[Hostile]:
    """What a rogue D sends P's connector port (`rid` prefixes the request ids it names)."""
    data = canonical_json({"mooncake": 1})
    return malformed_headers(f"{rid}-m") + [
        Hostile("non-ASCII tag", [tagged("reserve", f"{rid}-1", tag="é" * 32)], "bad_tag"),
        Hostile("NUL tag", [tagged("reserve", f"{rid}-2", tag="\x00")], "bad_tag"),
        Hostile("empty tag", [tagged("reserve", f"{rid}-3", tag="")], "bad_tag"),
        Hostile("tag of another id", [tagged("reserve", f"{rid}-4", request_id=f"{rid}-5")], "bad_tag"),
        Hostile("three body frames", [header("reserve", f"{rid}-6", _nonce(6), [b"{}"] * 3), b"{}", b"{}", b"{}"],
                "oversized"),
        Hostile("data over 1 MiB", [header("reserve", f"{rid}-7", _nonce(7)), b" " * ((1 << 20) + 1)], "oversized"),
        Hostile("ack with a body", [header("ack", f"{rid}-8", _nonce(8), [b"x"]), b"x"], "oversized"),
        Hostile("data not JSON", [header("reserve", f"{rid}-9", _nonce(9), [b"{nope"]), b"{nope"], "malformed", True),
        Hostile("data an array", [header("reserve", f"{rid}-10", _nonce(10), [b"[]"]), b"[]"], "malformed", True),
        Hostile("data too deep", [header("reserve", f"{rid}-11", _nonce(11), [_deep(b"", depth=DEEP)]),
                                  _deep(b"", depth=DEEP)], "malformed", True),
        Hostile("no nonce", [header("reserve", f"{rid}-12", "")], "malformed", True),
        Hostile("nonce not hex", [header("reserve", f"{rid}-13", "z" * 32)], "malformed", True),
        Hostile("ack for nothing", [header("ack", f"{rid}-14", _nonce(14))], "stale", True),
        Hostile("hand-off to P", [header("handoff", f"{rid}-15", NONCE)], "unexpected_kind", True),
        Hostile("refusal to P", [header("refuse", f"{rid}-16", NONCE)], "unexpected_kind", True),
        Hostile("reservation", [header("reserve", f"{rid}-17", _nonce(17)[::-1]), ], "", True),
        Hostile("its replay", [header("reserve", f"{rid}-17", _nonce(17)[::-1])], "replayed", True),
        Hostile("a duplicate", [header("reserve", f"{rid}-17", "ab" * 16)], "duplicate", True),
        Hostile("reservation data", [header("reserve", f"{rid}-18", "cd" * 16, [data]), data], "", True),
    ]


def to_d(rid: str, nonce: str) -> list[Hostile]:
    """What a rogue P sends D before it answers D's reservation of `rid` (made with `nonce`): none of it may
    end or disturb that reservation."""
    other = "ef" * 16
    return malformed_headers(f"{rid}-m") + [
        Hostile("hand-off with another nonce", [header("handoff", rid, other, [b"x"]), b"x"], "stale", True),
        Hostile("hand-off for another id", [header("handoff", f"{rid}-x", nonce, [b"x"]), b"x"], "stale", True),
        Hostile("refusal with another nonce", [header("refuse", rid, other)], "stale", True),
        Hostile("acceptance with another nonce", [header("accept", rid, other)], "stale", True),
        Hostile("acceptance with a body", [header("accept", rid, nonce, [b"x"]), b"x"], "oversized"),
        Hostile("reservation to D", [header("reserve", rid, nonce)], "unexpected_kind", True),
        Hostile("ack to D", [header("ack", rid, nonce)], "unexpected_kind", True),
        Hostile("bad tag for another id", [tagged("handoff", f"{rid}-y", nonce, tag="é")], "bad_tag"),
        Hostile("refusal with two frames", [header("refuse", rid, nonce, [b"{}", b"{}"]), b"{}", b"{}"],
                "oversized"),
    ]
