"""P's route table (fastdeploy/splitwise/zmq_routes.py, SERVICES §7): routes are never evicted, each cap refuses by
name, a dropped route gives its place and its bytes back, and a nonce is taken once."""
from __future__ import annotations

import pytest

from fastdeploy.splitwise import zmq_routes
from fastdeploy.splitwise.zmq_routes import RouteTable


@pytest.mark.parametrize("cap, value, nbytes, names", [("MAX_ROUTES", 3, 0, "3 reservations (its limit)"),
                                                       ("MAX_ROUTES_PER_PEER", 3, 0, "of that D"),
                                                       ("MAX_HELD_BYTES_PER_PEER", 30, 10, "that D's reservation data"),
                                                       ("MAX_HELD_BYTES", 30, 10, "bytes of reservation data")],
                         ids=["routes", "routes-per-d", "bytes-per-d", "bytes"])
def test_each_cap_refuses_by_name_and_a_dropped_route_gives_its_place_back(monkeypatch, cap, value, nbytes, names):
    monkeypatch.setattr(zmq_routes, cap, value)
    table = RouteTable()
    for i in range(3):
        assert table.full(b"d1", nbytes) is None
        table.add(f"r{i}", b"d1", f"n{i}", nbytes)
    why = table.full(b"d1", nbytes)
    assert why is not None and names in why
    assert [table.get(f"r{i}").identity for i in range(3)] == [b"d1"] * 3   # nothing was evicted
    table.drop("r0")
    table.drop("r0")   # a second drop changes nothing
    assert "r0" not in table and table.get("r0") is None and table.full(b"d1", nbytes) is None


def test_the_per_d_caps_count_each_d_apart(monkeypatch):
    monkeypatch.setattr(zmq_routes, "MAX_ROUTES_PER_PEER", 1)
    monkeypatch.setattr(zmq_routes, "MAX_HELD_BYTES_PER_PEER", 10)
    table = RouteTable()
    table.add("a", b"d1", "n1", 10)
    assert table.full(b"d1", 0) is not None
    assert table.full(b"d2", 10) is None


def test_a_nonce_is_taken_once_and_only_the_oldest_are_forgotten(monkeypatch):
    monkeypatch.setattr(zmq_routes, "MAX_NONCES", 2)
    table = RouteTable()
    assert [table.is_replay(n) for n in ("a", "b", "a")] == [False, False, True]
    assert table.is_replay("c") is False   # "a" is forgotten past the cap, "b" and "c" are kept
    assert [table.is_replay(n) for n in ("b", "c", "a")] == [True, True, False]
