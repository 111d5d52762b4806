"""The `hosts` fixture: a private network of hosts (tests/hosts/netns.py) removed at the test's end, also when the
test fails or is interrupted; the test is skipped, with the reason, where this machine cannot build one."""
from __future__ import annotations

import pytest

from tests.hosts import netns
from tests.services import launcher


@pytest.fixture
def hosts():
    """`hosts("router", "prefill", "decode")` builds a Network of those hosts (addresses 10.241.0.1, .2, ...)."""
    reason = netns.unavailable_reason()
    if reason is not None:
        pytest.skip(f"cannot build hosts here: {reason}")
    built: list[netns.Network] = []

    def build(*names: str) -> netns.Network:
        built.append(netns.Network(names))
        return built[-1]

    try:
        yield build
    finally:
        for network in built:
            network.close()
        assert not [name for network in built for name in network.namespaces() if name in netns.leftovers()]


@pytest.fixture(scope="session", autouse=True)
def hosts_log_dir(tmp_path_factory):
    launcher.LOG_DIR = tmp_path_factory.mktemp("hosts-logs")
    yield launcher.LOG_DIR
    launcher.LOG_DIR = None
