"""The hosts harness itself (docs/testing.md, "Hosts"): hosts reach each other over the bridge, a partition and a
loss rule cut only the named pair, a host's link can go down and up, and closing the network leaves no namespace and
no process behind."""
from __future__ import annotations

import socket
import sys
import time

import pytest

from tests.hosts import netns

_LISTEN = ("import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
           "s.bind(('0.0.0.0', 7000)); s.listen(64)\nwhile True:\n    s.accept()[0].close()\n")


def _reaches(address: str, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, 7000), timeout=timeout_s):
            return True
    except OSError:
        return False


def _reaches_soon(host: netns.Host, address: str, wait_s: float = 30.0) -> bool:
    """Whether `host` reaches `address` within `wait_s` (the listener may still be starting): a bounded wait."""
    deadline = time.monotonic() + wait_s
    while not host.call(_reaches, address, timeout=5):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_partition_cuts_only_the_named_pair_and_heals(hosts):
    net = hosts("a", "b", "c")
    net["b"].popen([sys.executable, "-c", _LISTEN])
    assert _reaches_soon(net["a"], net["b"].address)
    net["a"].partition(net["b"])
    assert not net["a"].call(_reaches, net["b"].address, timeout=5)
    assert net["c"].call(_reaches, net["b"].address, timeout=5)
    net["a"].heal()
    assert _reaches_soon(net["a"], net["b"].address)


def test_a_host_link_down_cuts_it_off_until_up(hosts):
    net = hosts("a", "b")
    net["b"].popen([sys.executable, "-c", _LISTEN])
    assert _reaches_soon(net["a"], net["b"].address)
    net["b"].link_down()
    assert not net["a"].call(_reaches, net["b"].address, timeout=5)
    net["b"].link_up()
    assert _reaches_soon(net["a"], net["b"].address)


def test_total_loss_drops_and_rate_limit_installs(hosts):
    net = hosts("a", "b")
    net["b"].popen([sys.executable, "-c", _LISTEN])
    assert _reaches_soon(net["a"], net["b"].address)
    net["a"].set_loss(100, net["b"])
    assert not net["a"].call(_reaches, net["b"].address, timeout=5)
    net["a"].heal()
    net["a"].set_rate("100mbit")
    assert "tbf" in net["a"].run("tc", "qdisc", "show", "dev", "eth0").stdout
    assert _reaches_soon(net["a"], net["b"].address)


def test_hosts_cap_tcp_retransmission_backoff_and_leave_the_machine_s_own(hosts):
    if not netns._RTO_MAX_SYSCTL.exists():
        pytest.skip("this kernel has no per-namespace net.ipv4.tcp_rto_max_ms (Linux >= 6.15)")
    own = netns._RTO_MAX_SYSCTL.read_text()
    net = hosts("a")
    assert net["a"].run("sysctl", "-n", "net.ipv4.tcp_rto_max_ms").stdout.strip() == str(netns.RTO_MAX_MS)
    assert netns._RTO_MAX_SYSCTL.read_text() == own


def test_closing_leaves_no_namespace_and_no_process():
    net = netns.Network(["a", "b"])
    process = net["a"].popen([sys.executable, "-c", _LISTEN])
    names = net.namespaces()
    net.close()
    assert process.poll() is not None
    assert not set(names) & set(netns.leftovers())


def test_orphans_of_a_dead_creator_are_swept():
    """Namespaces named after a creator that no longer runs (killed before cleaning up) go at the next build."""
    dead = 2 ** 22 + 12345    # above the default pid_max: no process has it
    orphan = f"fdh{dead}-0-net"
    netns._run("ip", "netns", "add", orphan)
    assert orphan in netns.sweep_orphans()
    assert orphan not in netns.leftovers(f"fdh{dead}-")
