"""The hostile-input battery against one API server (docs/serving.md, "Limits" and "Errors"; SERVICES §8 "Bad
input"): every bad or edge request of `hostile_cases.CASES`, raw malformed HTTP, disconnects at each stage and
bounded floods. Each case checks the status, the OpenAI error object and the client field it names, and then that
the server log has no traceback, /health is 200 and no slot or KV block is held.
"""
from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.services import launcher
from tests.services.hostile_cases import CASES, MAX_BODY, MAX_MODEL_LEN, Case, completion

LONG = {"max_tokens": 4000, "min_tokens": 4000}   # seconds of decoding: still running when the client acts
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with launcher.serving("--max-model-len", str(MAX_MODEL_LEN), "--max-body-bytes", str(MAX_BODY),
                          log_dir=tmp_path_factory.mktemp("hostile")) as server:
        yield server


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:   # one keep-alive connection for the table
        yield client


def assert_intact(server: launcher.Server, http: httpx.Client) -> None:
    """No traceback in the log, /health 200, every slot and block free (a bounded wait: the gauges follow the
    engine's next report). `http` is the battery's keep-alive connection."""
    log = server.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-4000:]
    assert http.get("/health").status_code == 200
    for _ in range(600):   # bounded (30 s)
        if _nothing_held(http):
            return
        time.sleep(0.05)
    raise AssertionError(f"slots or blocks still held: {http.get('/metrics').text[-3000:]}")


def _nothing_held(http: httpx.Client) -> bool:
    values = {s.name: s.value for f in text_string_to_metric_families(http.get("/metrics").text) for s in f.samples}
    return (values["fastdeploy:free_kv_blocks"] == values["fastdeploy:total_kv_blocks"]
            and values["fastdeploy:free_slots"] == values["fastdeploy:total_slots"]
            and values["fastdeploy:num_requests_running"] == 0 and values["fastdeploy:num_requests_waiting"] == 0)


def assert_error(response: httpx.Response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text[:1000]
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS and error["code"] == status, error
    assert error["param"] == param, error
    assert not re.match(r"request [\w.:-]+: ", error["message"]), error   # no internal request-id prefix
    assert "prompt_token_ids" not in json.dumps(error), error
    return error


def _send(http: httpx.Client, case: Case) -> httpx.Response:
    content = case.body if isinstance(case.body, (str, bytes)) else json.dumps(case.body)
    return http.post(case.path, content=content, headers={"content-type": "application/json"})


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_request_gets_its_status_and_names_the_clients_field(server, http, case):
    """One row of the table: the status; for a refusal the OpenAI error object naming the client's field (never an
    internal name or a `request <id>:` prefix); the server intact afterwards."""
    response = _send(http, case)
    if case.status == 200:
        assert response.status_code == 200, response.text[:1000]
        assert "choices" in response.json()
    else:
        assert_error(response, case.status, case.param)
    assert_intact(server, http)


# (case, raw bytes, status line prefix): refused by the HTTP layer (uvicorn's plain 400) or by the app
RAW_HTTP = [
    ("garbage-request-line", b"GARBAGE\r\n\r\n", b"HTTP/1.1 400"),
    ("http-0.9", b"GET /health\r\n\r\n", b"HTTP/1.1 400"),
    ("no-host-header", b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", b"HTTP/1.1 400"),
    ("control-byte-in-method", b"G\x01T /health HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 400"),
    ("nul-in-header-value", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", b"HTTP/1.1 400"),
    ("space-before-colon", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A : b\r\n\r\n", b"HTTP/1.1 400"),
    ("content-length-not-a-number", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
     b"HTTP/1.1 400"),
    ("content-length-negative", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
     b"HTTP/1.1 400"),
    ("content-length-twice", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
                             b"Content-Length: 20\r\n\r\n0123456789", b"HTTP/1.1 400"),
    ("chunked-and-content-length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                   b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b"HTTP/1.1 400"),
    ("bad-chunk-size", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
     b"HTTP/1.1 400"),
    ("content-length-beyond-limit", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                    b"Content-Length: 1000000000000\r\n\r\n", b"HTTP/1.1 413"),
    ("chunked-body-beyond-limit", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     + b"%x\r\n%s\r\n" % (MAX_BODY // 2, b"x" * (MAX_BODY // 2)) * 2 + b"1\r\nx\r\n0\r\n\r\n", b"HTTP/1.1 413"),
    ("one-huge-header", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
     b"HTTP/1.1 431"),
    ("many-headers", b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(500))
     + b"\r\n", b"HTTP/1.1 431"),
    ("huge-url", b"GET /" + b"a" * 60_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 404"),
    ("bad-percent-escape", b"GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 404"),
    ("valid-chunked-body", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     + b"%x\r\n%s\r\n0\r\n\r\n" % (len(json.dumps(completion()).encode()), json.dumps(completion()).encode()),
     b"HTTP/1.1 200"),
]


def _exchange(port: int, data: bytes, close: bool = True, timeout_s: float = 30.0) -> bytes:
    """Send `data` on a fresh connection (with `close`, asking the server to close it after this request) and read
    until the server closes."""
    head, sep, rest = data.partition(b"\r\n")
    if close and sep and b"HTTP/1.1" in head:
        data = head + b"\r\nConnection: close" + sep + rest
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


@pytest.mark.parametrize("case,data,status_line", RAW_HTTP, ids=[c[0] for c in RAW_HTTP])
def test_raw_malformed_http_is_refused_and_the_server_keeps_serving(server, http, case, data, status_line):
    """Malformed or oversized HTTP gets a 4xx from the HTTP layer, or from the app as an OpenAI error object."""
    answer = _exchange(server.port, data)
    assert answer.startswith(status_line), answer[:300]
    if status_line[9:10] == b"4" and b"content-type: application/json" in answer.lower():
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert set(body["error"]) == ERROR_KEYS
    assert_intact(server, http)


def test_pipelined_requests_on_one_connection_are_answered_in_order(server):
    answer = _exchange(server.port, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
                                    b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", close=False)
    assert answer.count(b"HTTP/1.1 200") == 2 and answer.index(b"alive") < answer.index(b'"ok"'), answer[:500]


BODY = json.dumps(completion(**LONG)).encode()
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"

# (stage, bytes sent before the client closes the connection)
EARLY_DISCONNECTS = [
    ("right-after-connect", b""),
    ("mid-request-line", b"POST /v1/comp"),
    ("mid-headers", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"),
    ("after-headers", HEAD % len(BODY)),
    ("before-body-end", HEAD % len(BODY) + BODY[:len(BODY) // 2]),
]


@pytest.mark.parametrize("stage,data", EARLY_DISCONNECTS, ids=[s for s, _ in EARLY_DISCONNECTS])
def test_client_leaving_before_the_request_is_complete_leaves_nothing(server, http, stage, data):
    """A client that closes before its request is complete: nothing runs, nothing is held, no traceback."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(data)
    assert_intact(server, http)


def _aborted(server: launcher.Server) -> float:
    return server.metrics().get("fastdeploy:request_aborted_total", 0)


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
def test_client_leaving_while_its_request_runs_aborts_it(server, http, stream):
    """A client that closes while its (long) request decodes: the request is aborted, its slot and blocks freed."""
    before = _aborted(server)
    body = json.dumps(completion(stream=stream, **LONG)).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(HEAD % len(body) + body)
        if stream:
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")      # the stream has begun
        server.wait_until(lambda s: s.metrics()["fastdeploy:num_requests_running"] >= 1, "the request running")
    server.wait_until(lambda s: _aborted(s) == before + 1, "the request counted as aborted")
    assert_intact(server, http)


def test_flood_of_bad_and_good_requests_at_once(server, http):
    """64 bad requests (a mix of table rows) and 16 good ones concurrently: each gets its own answer."""
    bad = [c for c in CASES if c.status == 400][::4][:64]

    async def flood():
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            async def send(case: Case):
                content = case.body if isinstance(case.body, (str, bytes)) else json.dumps(case.body)
                return case, await client.post(case.path, content=content)
            good = [Case(f"good-{i}", "/v1/completions", completion(prompt=f"Hello {i}"), 200) for i in range(16)]
            return await asyncio.gather(*(send(c) for c in bad + good))

    for case, response in asyncio.run(flood()):
        if case.status == 200:
            assert response.status_code == 200, response.text[:500]
            assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
        else:
            assert_error(response, case.status, case.param)
    assert_intact(server, http)


def test_no_traceback_after_the_whole_battery(server, http):
    """The battery's last word: the same server answers a valid request; its log has no traceback."""
    assert http.post("/v1/completions", json=completion()).status_code == 200
    assert_intact(server, http)
