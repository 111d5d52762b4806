"""Faults of SERVICES §6's table against real router, P and D processes (fd-toy, MTP K = 1): what the client
sees, and that P's and D's /metrics show nothing held afterwards (SERVICES §6, §8 "Faults")."""
from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import openai
import pytest
import zmq

from tests.services import deployment as deploy
from tests.services import launcher

K = 1
PROMPT = "On Monday, Judy"
# A stream that is surely still running when a test kills something under it: fd-toy may meet EOS early, so the
# length is forced, and long (fd-toy decodes 400 tokens in under a second, which a loaded CI machine can spend
# between reading the first chunk and the kill: the stream then ended whole).
LONG = {"max_tokens": 4000, "min_tokens": 4000}
LENGTH = ("--max-model-len", "4096")   # every P and D here: room for LONG


@pytest.fixture(scope="module")
def pd():
    """One deployment for the faults that leave P and D running."""
    deployment = deploy.pd_deployment(k=K, prefill_flags=LENGTH, decode_flags=LENGTH)
    try:
        yield deployment
    finally:
        deployment.stop()


def stream_first_chunk(client: httpx.Client, body: dict) -> tuple[httpx.Response, object]:
    """Opens a stream and reads its first event; returns the response and its (still open) line iterator."""
    response = client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
    lines = response.iter_lines()
    assert next(lines).startswith("data: ")
    return response, lines


def read_rest(lines) -> str:
    """The rest of a stream: text until the server closes it (an error or [DONE])."""
    return "\n".join(lines)


def test_client_disconnect_frees_prefill_and_decode(pd):
    """SERVICES §6 (client disconnects): the router closes both upstream requests; P and D free everything."""
    with httpx.Client(base_url=pd.router.url, timeout=60.0) as http:
        for _ in range(3):
            response, _lines = stream_first_chunk(http, {"model": "fd-toy", "prompt": PROMPT, **LONG,
                                                         "stream": True})
            response.close()
    pd.wait_nothing_held()
    with pd.client() as client:  # and both keep serving
        assert client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=4).choices[0].finish_reason


def test_router_restart_fails_in_flight_then_serves_after_reregistration(pd):
    """SERVICES §6 (router restarts): the request in flight through the killed router fails; nothing stays held
    on P or D; a new router on the same port serves once P and D have re-registered."""
    port = pd.router.port
    with httpx.Client(base_url=pd.router.url, timeout=60.0) as http:
        response, lines = stream_first_chunk(http, {"model": "fd-toy", "prompt": PROMPT, **LONG,
                                                    "stream": True})
        os.killpg(pd.router.process.pid, signal.SIGKILL)
        with pytest.raises(httpx.HTTPError):
            read_rest(lines)
        response.close()
    launcher.stop(pd.router)
    pd.wait_nothing_held()
    pd.router = deploy.start_router("--splitwise", port=port)
    pd.await_ready()
    with pd.client() as client:
        answer = client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=6)
        assert answer.usage.completion_tokens >= 1
    pd.wait_nothing_held()


def _corrupting_proxy(prefill_addr: str, stop: threading.Event):
    """A man in the middle between D and P's connector that flips one byte of every hand-off's KV (its last frame,
    or a streamed piece's bytes).

    Returns (its address, the thread). D talks to it as if it were P (ROUTER); it talks to P as a D (DEALER).
    """
    context = zmq.Context.instance()
    facing_d = context.socket(zmq.ROUTER)
    facing_d.setsockopt(zmq.LINGER, 0)
    port = facing_d.bind_to_random_port("tcp://127.0.0.1")
    facing_p = context.socket(zmq.DEALER)
    facing_p.setsockopt(zmq.LINGER, 0)
    facing_p.connect(f"tcp://{prefill_addr}")

    def run():
        d_identity = None
        poller = zmq.Poller()
        poller.register(facing_d, zmq.POLLIN)
        poller.register(facing_p, zmq.POLLIN)
        try:
            while not stop.is_set():
                ready = dict(poller.poll(50))
                if facing_d in ready:
                    d_identity, *frames = facing_d.recv_multipart()
                    facing_p.send_multipart(frames)
                if facing_p in ready:
                    frames = facing_p.recv_multipart()
                    if json.loads(frames[0]).get("kind") in ("handoff", "kv") and len(frames) > 1:   # KV bytes
                        damaged = bytearray(frames[-1])
                        damaged[len(damaged) // 2] ^= 0xFF
                        frames[-1] = bytes(damaged)
                    facing_d.send_multipart([d_identity, *frames])
        finally:
            facing_d.close()
            facing_p.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return f"127.0.0.1:{port}", thread


def test_corrupted_handoff_fails_the_request_naming_the_cause(pd):
    """SERVICES §6 (hand-off corrupted): a hand-off whose KV is damaged on the wire fails its integrity tag at D's
    receipt (PD_MTP_FLOW §5.2 step 1), which fails the request at once; the client gets an error naming the cause;
    D's ack frees P's blocks and both keep serving."""
    rows = {row["role"]: row for row in deploy.registered(pd.router).values()}
    stop = threading.Event()
    proxy, thread = _corrupting_proxy(rows["prefill"]["connector_addr"], stop)
    info = {"request_id": "cmpl-corrupted-handoff", "prefill_addr": proxy,
            "decode_addr": rows["decode"]["connector_addr"]}
    body = {"model": "fd-toy", "prompt": PROMPT, "max_tokens": 8, "disaggregate_info": info}
    try:
        with httpx.Client(timeout=8.0) as http:
            prefill = threading.Thread(target=lambda: http.post(pd.instances["prefill"].url + "/v1/completions",
                                                                json=body), daemon=True)
            prefill.start()
            answer = http.post(pd.instances["decode"].url + "/v1/completions", json=body)
            prefill.join(timeout=30)
        assert answer.status_code >= 400
        message = answer.json()["error"]["message"]
        assert "tag" in message or "corrupt" in message or "integrity" in message, message
    finally:
        stop.set()
        thread.join(timeout=10)
    pd.wait_nothing_held()


@pytest.fixture()
def own_pd(request):
    """A deployment for one destructive fault; `request.param` holds pd_deployment's keyword arguments."""
    param = getattr(request, "param", {})
    flags = {f"{role}_flags": (*LENGTH, *param.get(f"{role}_flags", ())) for role in ("prefill", "decode")}
    deployment = deploy.pd_deployment(**{"k": K, **param, **flags})
    try:
        yield deployment
    finally:
        deployment.stop()


def test_sigkill_decode_mid_stream_gives_error_and_prefill_frees(own_pd):
    """SERVICES §6 (D dies mid-request): the client's stream ends in an error chunk or a closed stream, P holds
    nothing afterwards, and the router answers 503 at once once D is seen unhealthy."""
    decode = own_pd.instances["decode"]
    with httpx.Client(base_url=own_pd.router.url, timeout=60.0) as http:
        response, lines = stream_first_chunk(http, {"model": "fd-toy", "prompt": PROMPT, **LONG,
                                                    "stream": True})
        os.killpg(decode.process.pid, signal.SIGKILL)
        rest = read_rest(lines)
        response.close()
    assert '"error"' in rest and "[DONE]" not in rest
    own_pd.wait_nothing_held("prefill")
    own_pd.router.wait_until(
        lambda r: httpx.post(r.url + "/v1/completions", json={"model": "fd-toy", "prompt": "x"},
                             timeout=30).status_code == 503, "503 once D is unhealthy")


# The router checks health every 2 s here: a stopped P must still look healthy when the request is sent.
@pytest.mark.parametrize("own_pd", [{"router_flags": ("--health-interval-secs", "2")}], indirect=True)
def test_sigkill_prefill_before_handoff_gives_error_and_decode_frees(own_pd):
    """SERVICES §6 (P dies before the hand-off): P is stopped (SIGSTOP) so that it cannot hand off, then killed;
    the client gets an error at once and D frees its reservation."""
    prefill = own_pd.instances["prefill"]
    os.killpg(prefill.process.pid, signal.SIGSTOP)
    result = {}

    def ask():
        with own_pd.client() as client:
            try:
                client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=8)
            except openai.APIStatusError as error:
                result["status"] = error.status_code
                result["message"] = str(error)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    # D must have reserved the request before P dies, so that the test sees the reservation freed.
    own_pd.router.wait_until(lambda _: launcher.nothing_held(own_pd.instances["decode"]) is False,
                             "D holding the request")
    os.killpg(prefill.process.pid, signal.SIGKILL)
    asker.join(timeout=60)
    assert result.get("status") in (502, 503), result
    assert "prefill" in result["message"]
    own_pd.wait_nothing_held("decode")


@pytest.mark.parametrize("own_pd", [{"decode_flags": deploy.spec_flags(2)}], indirect=True)
def test_config_mismatch_router_refuses_and_forced_pair_refused_at_receipt(own_pd):
    """SERVICES §5, §6 (config hash differs): the router never pairs P (K = 1) with D (K = 2): 503 naming the
    hashes; a pair forced past the router is refused at D's receipt, with an error naming the hash, and both
    free everything."""
    answer = httpx.post(own_pd.router.url + "/v1/completions", json={"model": "fd-toy", "prompt": PROMPT},
                        timeout=30)
    assert answer.status_code == 503 and "config_hash" in answer.json()["error"]["message"]
    rows = {row["role"]: row for row in deploy.registered(own_pd.router).values()}
    info = {"request_id": "cmpl-forced-mismatch", "prefill_addr": rows["prefill"]["connector_addr"],
            "decode_addr": rows["decode"]["connector_addr"]}
    body = {"model": "fd-toy", "prompt": PROMPT, "max_tokens": 8, "disaggregate_info": info}
    with httpx.Client(timeout=60.0) as http:
        prefill = threading.Thread(target=lambda: http.post(own_pd.instances["prefill"].url + "/v1/completions",
                                                            json=body), daemon=True)
        prefill.start()
        answer = http.post(own_pd.instances["decode"].url + "/v1/completions", json=body)
        prefill.join(timeout=60)
    assert answer.status_code >= 400
    assert "hash" in answer.json()["error"]["message"], answer.text
    own_pd.wait_nothing_held()


def test_wrong_secret_never_connects_and_fails_the_request_naming_the_secret(tmp_path):
    """SERVICES §7 (wrong secret): with P and D keyed differently, D's connection to P never completes its
    handshake (peer_auth.py), so P receives nothing (nothing refused, nothing computed) and D fails the request at
    its reservation-ack deadline, so the client gets an error naming the address and the secret, not a hang; both
    sides hold nothing afterwards."""
    secrets = []
    for name in ("p", "d"):
        path = tmp_path / f"{name}.secret"
        path.write_text(f"secret-of-{name}")
        secrets.append(str(path))
    deployment = deploy.pd_deployment(k=K, prefill_flags=("--pd-secret-file", secrets[0]),
                                      decode_flags=("--pd-secret-file", secrets[1],
                                                    "--pd-reservation-ack-timeout-secs", "1"),
                                      router_flags=("--request-timeout-secs", "5"))
    try:
        answer = httpx.post(deployment.router.url + "/v1/completions",
                            json={"model": "fd-toy", "prompt": PROMPT, "max_tokens": 4}, timeout=60)
        assert answer.status_code >= 500 and "the same PD secret" in answer.json()["error"]["message"], answer.text
        metrics = deployment.instances["prefill"].metrics()
        refused = sum(v for k, v in metrics.items() if k.startswith("fastdeploy:pd_messages_refused_total"))
        assert refused == 0, "nothing of D's may reach P"
        deployment.wait_nothing_held()
    finally:
        deployment.stop()
