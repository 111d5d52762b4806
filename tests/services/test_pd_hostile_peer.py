"""The hostile-peer battery against a real router, P and D (SERVICES §6-§7, docs/design.md §8): catalogued
malformed, oversized, mistyped, deeply nested, replayed, duplicated and misdirected frames sent to P's connector
port and, by a rogue P that D is paired with over HTTP, to D; odd pairing fields sent to D over HTTP; a pair given
two bodies under one id, over ZeroMQ and over Mooncake. Afterwards P's and D's engine cores are the same processes
and a request through the router returns the in-process LLM's greedy text."""
from __future__ import annotations

import json
import threading

import httpx
import pytest
import zmq

from fastdeploy import LLM, SamplingParams
from tests.services import deployment as deploy
from tests.services import launcher
from tests.services.test_pd_transfer_faults import TRANSPORTS, transfer_flags
from tests.splitwise.rogue import header, holding_secret, nonce_of, to_d, to_p

PROMPT = "On Monday, Judy"
TIMEOUT = ("--pd-timeout-secs", "20")   # a reservation the rogue P never answers fails within this
ODD_PAIRINGS = [
    ({"disaggregate_info": {"request_id": "odd", "prefill_addr": addr}}, "disaggregate_info.prefill_addr")
    for addr in ["-:5000", "_x:5000", ".a.:5000", "a..b:5000", "a:0", "a:99999", "a:+80", "::1:80", "[::1",
                 "[zz::1]:80", "a b:80", "a;b:80", "1.2.3.999:80", "a:", ":80", "p.example:5000", "a" * 301 + ":80", 5, [], {}]
] + [
    ({"disaggregate_info": {"request_id": "odd", "prefill_addr": "127.0.0.1:1", "decode_addr": "-:1"}},
     "disaggregate_info.decode_addr"),
    ({"disaggregate_info": {"request_id": "odd id!", "prefill_addr": "127.0.0.1:1"}}, "disaggregate_info.request_id"),
    ({"disaggregate_info": {"request_id": "", "prefill_addr": "127.0.0.1:1"}}, "disaggregate_info.request_id"),
    ({"disaggregate_info": {"request_id": "odd", "prefill_addr": "127.0.0.1:1", "x": 1}}, "disaggregate_info.x"),
    ({"bootstrap_host": "-bad", "bootstrap_port": 8998, "bootstrap_room": 1}, "bootstrap_host"),
    ({"bootstrap_host": "[zz]", "bootstrap_port": 8998, "bootstrap_room": 1}, "bootstrap_host"),
    ({"bootstrap_host": "a..b", "bootstrap_port": 8998, "bootstrap_room": 1}, "bootstrap_host"),
    ({"bootstrap_host": "p.example", "bootstrap_port": 8998, "bootstrap_room": 1}, "bootstrap_host"),
    ({"bootstrap_host": "127.0.0.1", "bootstrap_port": 0, "bootstrap_room": 1}, "bootstrap_port"),
    ({"bootstrap_host": "127.0.0.1", "bootstrap_port": 70000, "bootstrap_room": 1}, "bootstrap_port"),
    ({"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": -1}, "bootstrap_room"),
]


@pytest.fixture(scope="module")
def greedy() -> str:
    return LLM(model="fd-toy").generate([PROMPT], SamplingParams(max_tokens=8), use_tqdm=False)[0].outputs.text


def _refused(server) -> float:
    return sum(v for k, v in server.metrics().items() if k.startswith("fastdeploy:pd_messages_refused_total"))


def _attack_p(connector_addr: str, secret: bytes | None) -> tuple[zmq.Socket, int]:
    """Every to_p frame on P's connector port (P reads them when it next steps); the rogue's socket (kept open
    until they are read) and the number P must refuse (the accepted ones are reservations for ids no request
    comes for, which P drops at its deadline). With a secret the rogue holds its transport keys (a stranger
    delivers nothing: tests/splitwise/test_strangers.py), so its frames reach the checks behind the handshake."""
    rogue = holding_secret(zmq.Context.instance().socket(zmq.DEALER), secret)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(f"tcp://{connector_addr}")
    catalogue = to_p("hostile")
    for hostile in catalogue:
        rogue.send_multipart(hostile.frames)
    return rogue, sum(1 for h in catalogue if h.reason)


def _rogue_p(stop: threading.Event, secret: bytes | None) -> tuple[str, threading.Thread, list]:
    """A ROUTER playing P: each reservation it gets is answered with every to_d frame, then a (keyless) refusal
    that ends it; with the secret's transport keys, as `_attack_p`. Returns its address, its thread and the
    request ids it saw."""
    socket = holding_secret(zmq.Context.instance().socket(zmq.ROUTER), secret, server=True)
    socket.setsockopt(zmq.LINGER, 0)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    seen: list = []

    def run():
        try:
            while not stop.is_set():   # open until the test is done: closing drops what is still queued
                if not socket.poll(100):
                    continue
                identity, reservation, *_ = socket.recv_multipart()
                fields = json.loads(reservation)
                if fields["kind"] != "reserve":   # D's ack of the refusal
                    continue
                rid, nonce = fields["request_id"], nonce_of(reservation)
                seen.append(rid)
                for hostile in to_d(rid, nonce):
                    socket.send_multipart([identity, *hostile.frames])
                refusal = b'{"reason":"duplicate"}'
                socket.send_multipart([identity, header("refuse", rid, nonce, [refusal]), refusal])
        finally:
            socket.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return f"127.0.0.1:{port}", thread, seen


@pytest.mark.parametrize("secret", [None, "hostile-battery"], ids=["no-secret", "secret"])
def test_hostile_peers_and_odd_pairings_leave_p_and_d_serving_the_greedy_text(tmp_path, greedy, secret):
    flags = (*deploy.secret_flags(tmp_path, secret), *TIMEOUT)
    deployment = deploy.pd_deployment(prefill_flags=flags, decode_flags=flags)
    try:
        prefill, decode = deployment.instances["prefill"], deployment.instances["decode"]
        pids = (prefill.engine_core_pid(), decode.engine_core_pid())
        rows = {row["role"]: row for row in deploy.registered(deployment.router).values()}
        keys = None if secret is None else secret.encode()
        rogue_d, must_refuse = _attack_p(rows["prefill"]["connector_addr"], keys)
        try:
            stop, rounds = threading.Event(), 3
            rogue_addr, rogue, seen = _rogue_p(stop, keys)
            with httpx.Client(base_url=decode.url, timeout=60) as http:
                answers = [http.post("/v1/completions", json={
                    "model": "fd-toy", "prompt": PROMPT, "max_tokens": 4,
                    "disaggregate_info": {"request_id": f"rogue-{i}", "prefill_addr": rogue_addr}})
                    for i in range(rounds)]
                odd = [(http.post("/v1/completions", json={"model": "fd-toy", "prompt": PROMPT, **body}), field)
                       for body, field in ODD_PAIRINGS]
            stop.set()
            rogue.join(timeout=10)
            with deployment.client() as client:   # P steps for it, and reads the rogue D's frames on the way
                text = client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=8).choices[0].text
            prefill.wait_until(lambda s: _refused(s) >= must_refuse, f"P refusing {must_refuse} frames")
        finally:
            rogue_d.close()
        assert sorted(seen) == [f"rogue-{i}" for i in range(rounds)]
        for answer in answers:   # each fails at once with P's refusal (or the tag without the key), no hang
            assert answer.status_code >= 400, answer.text
            message = answer.json()["error"]["message"]
            assert ("tag did not verify" if secret else "refused the reservation") in message, message
        for answer, field in odd:
            assert answer.status_code == 400, (field, answer.text)
            assert answer.json()["error"]["param"] == field, (field, answer.text)
        per_round = sum(1 for _ in to_d("x", "0" * 32))
        decode.wait_until(lambda s: _refused(s) >= rounds * per_round, "D refusing the rogue P's frames")
        assert text == greedy

        assert (prefill.engine_core_pid(), decode.engine_core_pid()) == pids
        with deployment.client() as client:   # and once more, after every hostile frame was read
            assert client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=8).choices[0].text == greedy
        deployment.wait_nothing_held("decode")
    finally:
        deployment.stop()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_pair_given_two_bodies_under_one_id_fails_naming_the_mismatch(transport, greedy):
    """docs/design.md §8 through HTTP: prompt A to P, a longer prompt B to D, one request id (a reused sglang room,
    a client pairing by hand). D never decodes B on A's KV: the client gets an error naming the prompt mismatch,
    both free everything, and the router still serves the greedy text."""
    flags = transfer_flags(transport)
    deployment = deploy.pd_deployment(prefill_flags=flags, decode_flags=flags)
    try:
        rows = {row["role"]: row for row in deploy.registered(deployment.router).values()}
        info = {"request_id": "cmpl-two-bodies", "prefill_addr": rows["prefill"]["connector_addr"],
                "decode_addr": rows["decode"]["connector_addr"]}
        with httpx.Client(timeout=60.0) as http:
            prefill = threading.Thread(target=lambda: http.post(
                deployment.instances["prefill"].url + "/v1/completions",
                json={"model": "fd-toy", "prompt": "short", "max_tokens": 8, "disaggregate_info": info}),
                daemon=True)
            prefill.start()
            answer = http.post(deployment.instances["decode"].url + "/v1/completions",
                               json={"model": "fd-toy", "prompt": PROMPT + " and a longer prompt for D",
                                     "max_tokens": 8, "disaggregate_info": info})
            prefill.join(timeout=60)
        assert answer.status_code >= 400, answer.text
        message = answer.json()["error"]["message"]
        assert "made for another request" in message and "prompt has" in message, message
        deployment.wait_nothing_held()
        with deployment.client() as client:
            assert client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=8).choices[0].text == greedy
    finally:
        deployment.stop()


def test_bogus_pairings_fail_at_the_acknowledgement_deadline_and_never_starve_router_traffic(greedy):
    """Twice D's slots of requests paired by hand with an address no P serves: they take none of D's slots (no P
    completed a connection there) and each fails at D's reservation acknowledgement deadline naming it (not after
    the prefill deadline), while a request through the router is served the greedy text; D holds nothing
    afterwards."""
    # the router's request must meet the same deadline: it grows with the machine's load
    ack_s = 2 * launcher.load_slowdown()
    deployment = deploy.pd_deployment(decode_flags=("--pd-reservation-ack-timeout-secs", f"{ack_s:g}"))
    try:
        decode, answers = deployment.instances["decode"], []

        def bogus(i: int) -> None:
            answers.append(httpx.post(decode.url + "/v1/completions", timeout=60, json={
                "model": "fd-toy", "prompt": PROMPT, "max_tokens": 4,
                "disaggregate_info": {"request_id": f"bogus-{i}", "prefill_addr": "127.0.0.1:1"}}))

        threads = [threading.Thread(target=bogus, args=(i,), daemon=True) for i in range(16)]
        for thread in threads:
            thread.start()
        decode.wait_until(lambda s: s.metrics().get("fastdeploy:num_requests_waiting") >= 4,
                          "the bogus requests in D's queue")
        metrics = decode.metrics()
        assert metrics["fastdeploy:free_slots"] == metrics["fastdeploy:total_slots"], "a bogus request holds a slot"
        with deployment.client() as client:
            assert client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=8).choices[0].text == greedy
        for thread in threads:
            thread.join(timeout=60)
        assert len(answers) == 16
        for answer in answers:
            message = answer.json()["error"]["message"]
            assert answer.status_code >= 400 and "completed a connection at 127.0.0.1:1" in message, answer.text
        deployment.wait_nothing_held("decode")
    finally:
        deployment.stop()
