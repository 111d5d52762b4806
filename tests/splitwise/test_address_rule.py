"""The connector address rule (schema/pairing.py) against libzmq itself: every address the rule accepts is one
libzmq's `connect` takes (so a request that passes admission never fails at reservation for its address), and the
IPv6 zone ids libzmq refuses are refused by the rule, naming the zone id."""
from __future__ import annotations

import pytest
import zmq

from fastdeploy.schema.pairing import address_error

ZONE_IDS = ["lo", "1", "eth0", "a-b", "a_b", "lo.1", "A9", "a b", "$x", "a;b", "a*b", "é", "a\tb", "a]b", "", "a%b"]
ADDRESSES = [f"[::1%{zone}]:5000" for zone in ZONE_IDS] + ["[::1]:5000", "[fe80::1%eth0]:5000", "127.0.0.1:5000",
                                                         "host-a.example:5000"]


def _libzmq_connects(address: str) -> bool:
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(f"tcp://{address}")
        return True
    except zmq.ZMQError:
        return False
    finally:
        socket.close()


@pytest.mark.parametrize("address", ADDRESSES)
def test_an_address_the_rule_accepts_is_one_libzmq_connects_to(address):
    if address_error(address) is None:
        assert _libzmq_connects(address), f"the rule accepts {address!r}, libzmq's connect refuses it"


@pytest.mark.parametrize("zone", ["a b", "$x", "é", "a\tb"])
def test_zone_ids_libzmq_refuses_are_refused_naming_the_zone_id(zone):
    why = address_error(f"[::1%{zone}]:5000")
    assert why is not None and "zone id" in why
