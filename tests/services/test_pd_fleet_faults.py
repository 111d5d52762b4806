"""Faults at scale (docs/design.md "Router"): 2 P + 2 D on fd-toy with MTP K = 1 behind the router. A D that is
full is not chosen while another has room; one of two D SIGKILLed mid-stream ends its streams with an error event
while the other D's finish, P holds nothing afterwards, new requests go to the survivor and the restarted D takes
load again; the same for one of two P, killed before its hand-off. One deployment, the tests in file order."""
from __future__ import annotations

import os
import signal
import threading

import httpx
import pytest

from tests.services import deployment as deploy
from tests.services import launcher

K = 1
# D's slots are few so that a D can be filled; deadlines are short so that what a dead peer left expires soon
# 5 s on an idle machine, so a killed peer's request fails soon; longer under load, where good requests need it
FLAGS = ("--max-model-len", "8192", "--pd-timeout-secs", f"{5 * launcher.load_slowdown():g}")
DECODE_SLOTS = 2
PROMPT = "On Monday, Judy"
# a stream long enough to be killed in its middle: fd-toy's EOS is ignored, so it runs max_tokens (~4,400 MTP
# rounds: seconds, where 1,500 tokens once finished before the kill landed)
LONG = {"model": "fd-toy", "prompt": PROMPT, "max_tokens": 8000, "ignore_eos": True, "stream": True}

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def fleet():
    # health checked every second: a stopped P still looks healthy while the test sends it a request
    deployment = deploy.fleet_deployment("fd-toy", K, 2, 2, flags=(*FLAGS, "--max-num-seqs", str(DECODE_SLOTS)),
                                         router_flags=("--health-interval-secs", "1"))
    try:
        yield deployment
    finally:
        deployment.stop()


def rows(fleet: deploy.Deployment) -> dict[str, dict]:
    """The router's /registered rows by instance name."""
    by_port = deploy.registered(fleet.router)
    return {name: by_port[server.port] for name, server in fleet.instances.items() if server.port in by_port}


def open_stream(http: httpx.Client, url: str, body: dict):
    """Opens a stream and reads its first event; returns the response and its (still open) line iterator."""
    response = http.send(http.build_request("POST", url, json=body), stream=True)
    assert response.status_code == 200, response.read()
    lines = response.iter_lines()
    assert next(lines).startswith("data: ")
    return response, lines


def wait_router_sees_every_decode_idle(fleet: deploy.Deployment) -> None:
    """Nothing held anywhere, and the router's view agrees: every D's latest heartbeat reports all its slots
    free, so the next choices depend on the router's own counts only."""
    fleet.wait_nothing_held(*(name for name, server in fleet.instances.items() if server.process.poll() is None))
    fleet.router.wait_until(lambda _: all(row["free_capacity"] == DECODE_SLOTS for name, row in rows(fleet).items()
                                          if name.startswith("decode") and row["healthy"]),
                            "the router seeing every D idle")


def complete(fleet: deploy.Deployment, count: int) -> None:
    with fleet.client() as client:
        for _ in range(count):
            assert client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=6).usage.completion_tokens


def restart(fleet: deploy.Deployment, name: str) -> None:
    """Starts `name` again at its address and waits until the router uses it."""
    role = "prefill" if name.startswith("prefill") else "decode"
    slots = ("--max-num-seqs", str(DECODE_SLOTS))
    fleet.add(name, *deploy.fleet_flags(role, K, (*FLAGS, *slots)), port=fleet.instances[name].port)
    fleet.await_ready()


def test_a_full_decode_is_not_chosen_while_another_has_room(fleet):
    """decode0's slots are filled by requests sent around the router (P0 and decode0 directly), which only its
    heartbeat's load shows; while decode0 is full every request through the router goes to decode1, although
    the router itself has nothing outstanding on decode0."""
    connectors = {name: row["connector_addr"] for name, row in rows(fleet).items()}
    with httpx.Client(timeout=120.0) as http:
        held = []
        for i in range(DECODE_SLOTS):
            body = {**LONG, "disaggregate_info": {"request_id": f"cmpl-fleet-full-{i}",
                                                  "prefill_addr": connectors["prefill0"],
                                                  "decode_addr": connectors["decode0"]}}
            threading.Thread(target=httpx.post, args=(fleet.instances["prefill0"].url + "/v1/completions",),
                             kwargs={"json": {**body, "stream": False}, "timeout": 120.0}, daemon=True).start()
            held.append(open_stream(http, fleet.instances["decode0"].url + "/v1/completions", body))
        fleet.router.wait_until(lambda _: rows(fleet)["decode0"]["free_capacity"] == 0,
                                "decode0's heartbeat reporting it full")
        before = {name: row["assigned"] for name, row in rows(fleet).items()}
        complete(fleet, 3)
        after = {name: row["assigned"] for name, row in rows(fleet).items()}
        assert (after["decode0"] - before["decode0"], after["decode1"] - before["decode1"]) == (0, 3)
        for response, _ in held:
            response.close()
    wait_router_sees_every_decode_idle(fleet)


def test_a_decode_killed_mid_stream_fails_its_streams_only_and_a_restarted_one_takes_load(fleet):
    wait_router_sees_every_decode_idle(fleet)
    with httpx.Client(base_url=fleet.router.url, timeout=120.0) as http:
        streams = [open_stream(http, "/v1/completions", LONG) for _ in range(2)]
        assert [rows(fleet)[name]["outstanding"] for name in ("decode0", "decode1")] == [1, 1], \
            "one stream on each D"
        victim = fleet.instances["decode0"]
        os.killpg(victim.process.pid, signal.SIGKILL)
        rests = ["\n".join(lines) for _, lines in streams]
    failed = [rest for rest in rests if '"error"' in rest and "[DONE]" not in rest]
    finished = [rest for rest in rests if rest.rstrip().endswith("data: [DONE]")]
    assert (len(failed), len(finished)) == (1, 1), rests
    launcher.stop(victim)
    fleet.router.wait_until(lambda _: not rows(fleet).get("decode0", {}).get("healthy"), "decode0 seen down")
    fleet.wait_nothing_held("prefill0", "prefill1", "decode1")      # P's deadlines (5 s) bound this
    before = rows(fleet)["decode1"]["assigned"]
    complete(fleet, 3)
    assert rows(fleet)["decode1"]["assigned"] == before + 3, "new requests go to the surviving D"
    restart(fleet, "decode0")
    complete(fleet, 2)
    assert fleet.instances["decode0"].metrics()["fastdeploy:requests_number_total"] >= 1
    fleet.wait_nothing_held()


def test_a_prefill_killed_before_its_hand_off_fails_its_request_only_and_a_restarted_one_takes_load(fleet):
    """prefill0's engine core is stopped (SIGSTOP) so that it cannot hand off, two requests are sent (one lands on
    each P), then prefill0 is killed once its API server has taken its request: that request fails naming the
    prefill instance, the other succeeds, D frees the reservation, new requests go to prefill1, and the restarted
    prefill0 takes load again. (Its API server stays up until the kill, so the request is known to be on P: with the
    whole instance stopped, the router could still be connecting when the kill landed, find the port closed and
    rightly send the request to prefill1.)"""
    wait_router_sees_every_decode_idle(fleet)
    victim = fleet.instances["prefill0"]
    taken = victim.metrics()["fastdeploy:requests_number_total"]
    os.kill(victim.engine_core_pid(), signal.SIGSTOP)
    statuses = []

    def ask():
        answer = httpx.post(fleet.router.url + "/v1/completions", timeout=120.0,
                            json={"model": "fd-toy", "prompt": PROMPT, "max_tokens": 8})
        statuses.append((answer.status_code, answer.text))

    askers = [threading.Thread(target=ask, daemon=True) for _ in range(2)]
    for asker in askers:
        asker.start()
    victim.wait_until(lambda server: server.metrics()["fastdeploy:requests_number_total"] == taken + 1,
                      "prefill0's API server has taken a request")
    os.killpg(victim.process.pid, signal.SIGKILL)
    for asker in askers:
        asker.join(timeout=120)
    codes = sorted(code for code, _ in statuses)
    assert codes[0] == 200 and codes[1] in (502, 503), statuses
    assert "prefill" in [text for code, text in statuses if code != 200][0]
    launcher.stop(victim)
    fleet.wait_nothing_held("decode0", "decode1", "prefill1")
    fleet.router.wait_until(lambda _: not rows(fleet).get("prefill0", {}).get("healthy"), "prefill0 seen down")
    before = rows(fleet)["prefill1"]["assigned"]
    complete(fleet, 3)
    assert rows(fleet)["prefill1"]["assigned"] == before + 3, "new requests go to the surviving P"
    restart(fleet, "prefill0")
    complete(fleet, 2)
    assert fleet.instances["prefill0"].metrics()["fastdeploy:requests_number_total"] >= 1
    fleet.wait_nothing_held()


def test_a_decode_joins_at_run_time_takes_load_and_leaves_by_draining_with_its_stream_finished(fleet):
    """Join: a third D registers while the fleet serves and gets the next request (the least recently used).
    Leave: SIGTERM drains it; its stream in flight finishes with [DONE], it exits 0, and once the router sees it
    unhealthy (its /health answers 503 while draining) new requests go to the other D."""
    joined = fleet.add("decode2", *deploy.fleet_flags("decode", K, (*FLAGS, "--max-num-seqs", str(DECODE_SLOTS),
                                                                    "--drain-timeout-s", "60")))
    fleet.await_ready()
    wait_router_sees_every_decode_idle(fleet)
    with httpx.Client(base_url=fleet.router.url, timeout=120.0) as http:
        response, lines = open_stream(http, "/v1/completions", LONG)
        assert rows(fleet)["decode2"]["outstanding"] == 1, "the joined D takes the next request"
        joined.process.send_signal(signal.SIGTERM)
        rest = "\n".join(lines)
        response.close()
    assert rest.rstrip().endswith("data: [DONE]") and '"error"' not in rest
    assert joined.process.wait(60) == 0
    fleet.router.wait_until(lambda _: not rows(fleet).get("decode2", {}).get("healthy"), "decode2 seen gone")
    before = {name: rows(fleet)[name]["assigned"] for name in ("decode0", "decode1")}
    complete(fleet, 4)
    after = {name: rows(fleet)[name]["assigned"] for name in ("decode0", "decode1")}
    assert sum(after.values()) - sum(before.values()) == 4
    fleet.wait_nothing_held("prefill0", "prefill1", "decode0", "decode1")
