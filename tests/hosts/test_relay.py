"""The latency relay (tests/hosts/relay.py) and PD through it (SERVICES §6 "Across hosts", a P↔D path with 20 ms of
one-way delay): bytes cross the relay unchanged and no sooner than its delay each way, a partition still cuts the
relayed path, and 1P1D on three hosts with the P↔D path delayed serves the single instance's text over ZeroMQ and
over Mooncake TCP (every P↔D connection relayed: D's to P's connector, P's to D's transfer engine)."""
from __future__ import annotations

import socket
import sys
import time

import pytest

from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from tests.hosts import deployment as hosts_deploy
from tests.hosts.relay import Relay
from tests.hosts.test_pd_across_hosts import K, MODEL, PROMPTS, expected  # noqa: F401  (expected: a fixture)

DELAY_S = 0.020
_ECHO = ("import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         "s.bind(('0.0.0.0', 7001)); s.listen(8)\nwhile True:\n    c = s.accept()[0]\n"
         "    while (b := c.recv(65536)):\n        c.sendall(b)\n    c.close()\n")


def _echo_round_trip(address: str, payload: bytes) -> tuple[bytes, float]:
    """Connects to the echo server (retrying while it starts, bounded), sends `payload`, reads it back; (what came
    back, the seconds from the send to the last byte back)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((address, 7001), timeout=10)
            break
        except OSError:
            assert time.monotonic() < deadline, "the echo server did not start"
            time.sleep(0.05)
    with conn:
        started = time.monotonic()
        conn.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            got += chunk
        return got, time.monotonic() - started


def test_relay_delays_each_way_and_a_partition_still_cuts_it(hosts):
    net = hosts("a", "b")
    net["b"].popen([sys.executable, "-c", _ECHO])
    payload = bytes(range(256)) * 4096          # 1 MiB
    assert net["a"].call(_echo_round_trip, net["b"].address, b"up", timeout=60)[0] == b"up"   # it listens
    with Relay(net["a"], net["b"], DELAY_S) as relay:
        got, elapsed = net["a"].call(_echo_round_trip, net["b"].address, payload, timeout=60)
        assert got == payload
        assert elapsed >= 2 * DELAY_S, f"a round trip took {elapsed * 1e3:.1f} ms through a {DELAY_S * 1e3} ms relay"
        assert relay.connections == 1 and relay.bytes_relayed == 2 * len(payload)
        net["a"].partition(net["b"])
        with pytest.raises(OSError):
            net["a"].call(lambda: socket.create_connection((net["b"].address, 7001), timeout=2).recv(1), timeout=30)
        net["a"].heal()
    got, _ = net["a"].call(_echo_round_trip, net["b"].address, b"after", timeout=60)
    assert got == b"after" and relay.connections == 1, "the relay's redirect outlived it"


@pytest.mark.parametrize("transport", ["zmq", "mooncake-tcp"])
def test_pd_across_hosts_with_a_delayed_p_d_path_serves_the_single_instance_text(hosts, expected, transport):
    """20 ms one-way on every P↔D connection (40 ms a round trip), started before the instances so every
    connection between them is relayed: the router's answers are the single instance's text."""
    if transport != "zmq" and (reason := mooncake_unavailable_reason()) is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    net = hosts("router", "prefill", "decode")
    with Relay(net["decode"], net["prefill"], DELAY_S) as d_to_p, \
            Relay(net["prefill"], net["decode"], DELAY_S) as p_to_d:
        flags = hosts_deploy.MOONCAKE if transport != "zmq" else ()
        deployment = hosts_deploy.pd_across_hosts(net["router"], net["prefill"], net["decode"], k=K, flags=flags)
        try:
            deployment.await_ready()
            for (prompt, max_tokens), want in zip(PROMPTS, expected):
                assert deployment.complete(MODEL, prompt, max_tokens).choices[0].text == want, prompt
            deployment.wait_nothing_held()
            print(f"relayed: D→P {d_to_p.connections} connections, {d_to_p.bytes_relayed} bytes; "
                  f"P→D {p_to_d.connections} connections, {p_to_d.bytes_relayed} bytes")
            assert d_to_p.connections >= 1 and d_to_p.bytes_relayed > 0, "D's connector did not go through the relay"
            if transport != "zmq":
                assert p_to_d.connections >= 1 and p_to_d.bytes_relayed > 0, "P's writes did not go through the relay"
        finally:
            deployment.stop()
