"""What an instance advertises (fastdeploy/entrypoints/openai/advertise.py, SERVICES §5): `--advertise-host`, else
its one `--host`, else (bound to every interface) the address of its interface toward `--router`; an address that
reaches only this host is refused at start with one line when the router is elsewhere, and the router refuses a
registration from another host that names a loopback or wildcard address."""
from __future__ import annotations

import argparse
import subprocess
import sys

import httpx
import pytest

from fastdeploy.entrypoints.openai.advertise import (advertise_problem, advertise_warning, advertised_host, is_loopback,
                                                     route_source)
from fastdeploy.router.protocol import Registration, unreachable_field
from tests.services import launcher


def flags(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"host": "0.0.0.0", "router": None, "advertise_host": None, **given})


@pytest.mark.parametrize("given, want", [
    ({"advertise_host": "10.1.2.3", "host": "0.0.0.0"}, "10.1.2.3"),
    ({"advertise_host": "10.1.2.3", "host": "10.9.9.9"}, "10.1.2.3"),
    ({"host": "10.9.9.9", "router": "10.1.1.1:9000"}, "10.9.9.9"),
    ({"host": "0.0.0.0", "router": "127.0.0.1:9000"}, "127.0.0.1"),     # a router on this host: loopback is right
    ({"host": "::", "router": "localhost:9000"}, "127.0.0.1"),
])
def test_advertised_host_follows_the_rules_in_order(given, want):
    assert advertised_host(flags(**given)) == want


def test_wildcard_bound_instance_advertises_its_interface_toward_the_router(hosts):
    """On host b, bound to 0.0.0.0 with --router <host a>: b's own address on the shared link, not loopback and
    not the host name's (127.0.1.1 on a stock Debian host)."""
    net = hosts("a", "b")
    got = net["b"].call(advertised_host, flags(router=f"{net['a'].address}:9000"), timeout=10)
    assert got == net["b"].address
    assert net["b"].call(route_source, net["a"].address, 9000, timeout=10) == net["b"].address


@pytest.mark.parametrize("given, advertised, refused", [
    (flags(host="127.0.0.1", router="10.241.0.1:9000"), "127.0.0.1", "loopback address 127.0.0.1"),
    (flags(advertise_host="localhost", router="10.241.0.1:9000"), "localhost", "loopback address localhost"),
    (flags(advertise_host="0.0.0.0"), "0.0.0.0", "wildcard address"),
    (flags(host="127.0.0.1", router="127.0.0.1:9000"), "127.0.0.1", None),
    (flags(router="10.241.0.1:9000"), "10.241.0.2", None),
])
def test_unreachable_advertisements_are_refused(given, advertised, refused):
    problem = advertise_problem(given, advertised)
    assert (problem is None) if refused is None else (refused in problem and "\n" not in problem)


def test_loopback_toward_a_remote_router_is_refused_at_start_in_one_line():
    """`--host 127.0.0.1 --router <another host>`: exit status 2 and one error line, before the engine loads."""
    result = subprocess.run(
        [sys.executable, "-m", launcher.API_SERVER, "--model", "fd-tiny", "--host", "127.0.0.1", "--port", "1",
         "--splitwise-role", "prefill", "--router", "10.241.0.1:9000"],
        capture_output=True, text=True, timeout=120, cwd=launcher.REPO)
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert "loopback address 127.0.0.1" in lines[0] and "--advertise-host" in lines[0]


def _registration(host: str, connector: str | None = None) -> Registration:
    return Registration(role="prefill" if connector else "mixed", host=host, port=8180, connector_addr=connector,
                        model="m", config_hash="h", max_num_seqs=1, version="t")


@pytest.mark.parametrize("registration, sender, field", [
    (_registration("127.0.0.1"), "10.241.0.2", "host"),
    (_registration("0.0.0.0"), "10.241.0.2", "host"),
    (_registration("localhost"), "10.241.0.2", "host"),
    (_registration("10.241.0.2", "127.0.0.1:8191"), "10.241.0.2", "connector_addr"),
    (_registration("10.241.0.2", "10.241.0.2:8191"), "10.241.0.2", None),
    (_registration("127.0.0.1", "127.0.0.1:8191"), "127.0.0.1", None),     # one host: loopback is right
])
def test_router_refuses_loopback_registered_from_another_host(registration, sender, field):
    assert unreachable_field(registration, sender) == field


def test_is_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.1.1")
    assert not is_loopback("10.241.0.1") and not is_loopback("0.0.0.0")


def test_router_answers_400_to_a_loopback_registration_from_another_host(hosts):
    """The router's own guard (a sender older than the start-time check, or one started by hand): host b registers
    127.0.0.1 with the router on host a and is refused, naming the field; nothing is registered."""
    from tests.hosts import deployment as hosts_deploy
    net = hosts("a", "b")
    deployment = hosts_deploy.start_router(net["a"])
    try:
        body = _registration("127.0.0.1").model_dump()
        answer = net["b"].call(lambda: httpx.post(f"{deployment.router.url}/register", json=body, timeout=5),
                               timeout=10)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "host", answer.text
        assert deployment.registered() == {}
    finally:
        deployment.stop()


@pytest.mark.parametrize("given, advertised, warned", [
    (flags(), "127.0.1.1", True),                          # no router, a Debian host name: one host only
    (flags(), "10.241.0.2", False),
    (flags(advertise_host="127.0.0.1"), "127.0.0.1", False),   # asked for
    (flags(host="127.0.0.1"), "127.0.0.1", False),             # listens on loopback only: nothing else expected
])
def test_wildcard_bound_instance_advertising_loopback_is_warned_about(given, advertised, warned):
    warning = advertise_warning(given, advertised)
    assert (warning is not None) == warned and (warning is None or "--advertise-host" in warning)
