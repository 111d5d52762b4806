"""D connects to IP literals only (schema/pairing.py `peer_address_error`, design.md §8 "Connector addresses"): libzmq resolves a host name with a blocking getaddrinfo on the context's one I/O thread, so a slow name
in one request's `prefill_addr` would stall every reservation, acknowledgement and hand-off of D. A host name is
refused before admission, naming the field, wherever D could be handed one: the engine's `disaggregate_info`, the
HTTP body's, the transport; and an instance registers its connector at an IP address (resolved once, at start),
so the router never hands D a name."""
from __future__ import annotations

import argparse

import pydantic
import pytest

from fastdeploy.engine.connector.base import DisaggregateInfo
from fastdeploy.entrypoints.openai import protocol
from fastdeploy.entrypoints.openai.registration import registration
from fastdeploy.splitwise.zmq_transport import ZmqTransport

NAMES = ["p.example:5000", "localhost:5000", "p-1:80"]
LITERALS = ["127.0.0.1:5000", "[::1]:5000", "[fe80::1%eth0]:5000"]


@pytest.mark.parametrize("addr", NAMES)
def test_a_host_name_in_prefill_addr_is_refused_naming_the_field(addr):
    with pytest.raises(ValueError, match=r"field 'prefill_addr' must be 'ip:port' \(got host name"):
        DisaggregateInfo.parse({"request_id": "r", "prefill_addr": addr}, "r")
    with pytest.raises(pydantic.ValidationError, match="prefill_addr"):
        protocol.DisaggregateInfo(request_id="r", prefill_addr=addr)
    transport = ZmqTransport()
    try:
        with pytest.raises(ValueError, match="argument 'prefill_addr' must be 'ip:port'"):
            transport.reserve("r", addr)
        assert not transport.peer_ready(addr)
    finally:
        transport.close()


@pytest.mark.parametrize("addr", LITERALS)
def test_ip_literals_are_accepted_and_decode_addr_stays_informational(addr):
    info = DisaggregateInfo.parse({"request_id": "r", "prefill_addr": addr, "decode_addr": "d.example:1"}, "r")
    assert (info.prefill_addr, info.decode_addr) == (addr, "d.example:1")


def test_an_instance_registers_its_connector_at_an_ip_address():
    args = argparse.Namespace(host="localhost", port=8000, splitwise_role="prefill", served_model_name=None,
                              model="fd-toy", max_num_seqs=4)
    body = registration(args, {"connector_addr": "127.0.0.1:5555", "config_hash": "h"})
    assert body["connector_addr"] in ("127.0.0.1:5555", "[::1]:5555")
