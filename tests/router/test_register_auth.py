"""Signed registration (docs/design.md "Router", fastdeploy/router/auth.py): with a secret the router accepts a
heartbeat only when its HMAC verifies, its timestamp is fresh and its nonce is new; unsigned, forged, altered,
stale and replayed heartbeats are refused with 401 and change nothing. The signature is recomputed here from the
documented contract, not with the code under test, so a drift on either side fails."""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import select
import socket
import time

import httpx
import pytest

from fastdeploy.router.auth import (MAX_AGE_S, RegistrationAuthError, RegistrationVerifier, registration_secret,
                                    sign_headers)

from .harness import registered, start_router

SECRET = b"router-secret-for-tests"


def contract_headers(secret: bytes, body: bytes, timestamp: float | None = None, nonce: str | None = None) -> dict:
    """The documented signature: hex HMAC-SHA256 over "fd-register-v1\\n<timestamp>\\n<nonce>\\n<body>"."""
    stamp = f"{time.time() if timestamp is None else timestamp:.3f}"
    nonce = nonce or secrets.token_hex(16)
    mac = hmac.new(secret, b"fd-register-v1\n" + stamp.encode() + b"\n" + nonce.encode() + b"\n" + body,
                   hashlib.sha256).hexdigest()
    return {"x-fd-timestamp": stamp, "x-fd-nonce": nonce, "x-fd-signature": mac}


def body_of(port: int) -> bytes:
    return json.dumps({"role": "mixed", "host": "127.0.0.1", "port": port, "connector_addr": None, "model": "fd-toy",
                       "config_hash": "hash-a", "max_num_seqs": 4, "version": "test"}).encode()


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_signed_heartbeat_is_accepted_and_its_replay_refused():
    clock = Clock()
    verifier = RegistrationVerifier(SECRET, clock=clock)
    body = body_of(1)
    headers = contract_headers(SECRET, body, timestamp=clock.now)
    verifier.verify(headers, body)
    with pytest.raises(RegistrationAuthError, match="already used"):
        verifier.verify(headers, body)
    verifier.verify(sign_headers(SECRET, body, now=clock.now), body)   # the instances' signer follows the contract


@pytest.mark.parametrize("case", ["unsigned", "wrong_secret", "altered_body", "stale", "future", "bad_nonce",
                                  "timestamp_not_a_number"])
def test_bad_heartbeats_are_refused_naming_why(case):
    clock = Clock()
    verifier = RegistrationVerifier(SECRET, clock=clock)
    body = body_of(1)
    headers, sent = contract_headers(SECRET, body, timestamp=clock.now), body
    expected = {"unsigned": "not signed", "wrong_secret": "does not verify", "altered_body": "does not verify",
                "stale": "stale", "future": "stale", "bad_nonce": "nonce", "timestamp_not_a_number": "stale"}[case]
    if case == "unsigned":
        headers = {}
    elif case == "wrong_secret":
        headers = contract_headers(b"another-secret", body, timestamp=clock.now)
    elif case == "altered_body":
        sent = body.replace(b'"port": 1', b'"port": 2')
    elif case == "stale":
        headers = contract_headers(SECRET, body, timestamp=clock.now - MAX_AGE_S - 1)
    elif case == "future":
        headers = contract_headers(SECRET, body, timestamp=clock.now + MAX_AGE_S + 1)
    elif case == "bad_nonce":
        headers = contract_headers(SECRET, body, timestamp=clock.now, nonce="NOT-HEX")
    else:
        headers = contract_headers(SECRET, body, timestamp=clock.now)
        headers["x-fd-timestamp"] = "nan"
        headers["x-fd-signature"] = hmac.new(SECRET, b"\n".join((b"fd-register-v1", b"nan",
                                                                headers["x-fd-nonce"].encode(), body)),
                                             hashlib.sha256).hexdigest()
    with pytest.raises(RegistrationAuthError, match=expected):
        verifier.verify(headers, sent)


def test_a_heartbeat_is_fresh_for_the_whole_window_and_its_nonce_remembered_that_long():
    clock = Clock()
    verifier = RegistrationVerifier(SECRET, clock=clock)
    body = body_of(1)
    headers = contract_headers(SECRET, body, timestamp=clock.now)
    verifier.verify(headers, body)
    clock.now += MAX_AGE_S - 0.5            # still inside the window: the nonce is still known
    with pytest.raises(RegistrationAuthError, match="already used"):
        verifier.verify(headers, body)
    clock.now += 1.0                         # past the window: refused as stale, whatever the nonce store holds
    with pytest.raises(RegistrationAuthError, match="stale"):
        verifier.verify(headers, body)


def test_secret_is_router_secret_else_pd_secret():
    assert registration_secret({"FD_ROUTER_SECRET": " r ", "FD_PD_SECRET": "p"}) == b"r"
    assert registration_secret({"FD_PD_SECRET": "p"}) == b"p"
    assert registration_secret({}) is None
    with pytest.raises(ValueError, match="FD_ROUTER_SECRET"):
        registration_secret({"FD_ROUTER_SECRET": "  "})


def test_router_with_a_secret_refuses_unsigned_forged_stale_and_replayed_registrations():
    """The router process with FD_ROUTER_SECRET: each bad registration is a 401 OpenAI error object and registers
    nothing; the signed one registers the instance."""
    router = start_router(env={"FD_ROUTER_SECRET": SECRET.decode()})
    try:
        router.wait_ready()
        url = router.url + "/register"
        body = body_of(7001)
        good = contract_headers(SECRET, body)
        bad = {"unsigned": {}, "forged": contract_headers(b"guess", body),
               "stale": contract_headers(SECRET, body, timestamp=time.time() - 10 * MAX_AGE_S)}
        for name, headers in bad.items():
            answer = httpx.post(url, content=body, headers={"content-type": "application/json", **headers},
                                timeout=10.0)
            assert answer.status_code == 401, name
            assert answer.json()["error"]["type"] == "authentication_error", name
        assert registered(router) == {}
        answer = httpx.post(url, content=body, headers={"content-type": "application/json", **good}, timeout=10.0)
        assert answer.status_code == 200, answer.text
        assert list(registered(router)) == [7001]
        replay = httpx.post(url, content=body, headers={"content-type": "application/json", **good}, timeout=10.0)
        assert replay.status_code == 401 and "replayed" in replay.json()["error"]["message"]
        signed_but_invalid = b'{"role": "mixed"}'
        answer = httpx.post(url, content=signed_but_invalid, timeout=10.0,
                            headers={"content-type": "application/json",
                                     **contract_headers(SECRET, signed_but_invalid)})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "host"
        output = router.output()
        assert output.count("registration refused") == len(bad) + 1 and "Traceback" not in output
    finally:
        assert router.stop() == 0


def _chunked_register(port: int, chunks: int, headers: dict[str, str], chunk: bytes = b" " * 65536) -> bytes:
    """POST /register with a chunked body (no Content-Length) of `chunks` chunks that never ends: the router must
    answer without the rest of the body. Returns the start of its answer (b"" if none came in 20 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        sock.sendall(f"POST /register HTTP/1.1\r\nhost: 127.0.0.1\r\ntransfer-encoding: chunked\r\n"
                     f"content-type: application/json\r\n{head}\r\n".encode())
        for _ in range(chunks):
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:   # the router answered and closed the connection
                break
        try:
            return sock.recv(4096)
        except TimeoutError:
            return b""


def test_register_checks_the_signature_headers_and_the_size_before_reading_the_body():
    """An unsigned registration is refused (401) from its headers, before its body (one that never ends here) is
    read; an endless chunked body is refused (413) once past the limit, never buffered whole."""
    router = start_router(env={"FD_ROUTER_SECRET": SECRET.decode()})
    open_router = start_router()
    try:
        router.wait_ready()
        open_router.wait_ready()
        assert _chunked_register(router.port, 1, {}).startswith(b"HTTP/1.1 401")
        assert _chunked_register(open_router.port, 64, {}).startswith(b"HTTP/1.1 413")
        assert registered(router) == {} and registered(open_router) == {}
    finally:
        router.stop()
        open_router.stop()
