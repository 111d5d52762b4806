"""The router's registry rules in-process, with a fake clock: registration contract, health hysteresis,
heartbeat expiry, least-outstanding choice and config-hash pairing (SERVICES §5)."""
from __future__ import annotations

import json
import random

import pytest
from pydantic import ValidationError

from fastdeploy.router.protocol import Load, Registration
from fastdeploy.router.registry import (EXACT_CHOICE_MAX_CANDIDATES, NoHealthyTargetError, Registry, prompt_size,
                                        UnknownModelError)
from fastdeploy.router.router import RouterSettings, create_app


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reg(port: int, role: str = "mixed", config_hash: str = "h1", model: str = "fd-toy") -> Registration:
    return Registration(role=role, host="127.0.0.1", port=port,
                        connector_addr=None if role == "mixed" else f"127.0.0.1:{port + 1000}",
                        model=model, config_hash=config_hash, max_num_seqs=4, version="1")


def make(*registrations: Registration, seed: int = 0) -> tuple[Registry, Clock]:
    clock = Clock()
    registry = Registry(1.0, clock=clock, rng=random.Random(seed))
    for registration in registrations:
        registry.register(registration)
    return registry, clock


@pytest.mark.parametrize("field, value", [
    ("role", "both"), ("port", 0), ("port", 70000), ("port", "8000"), ("host", ""), ("model", ""),
    ("config_hash", ""), ("max_num_seqs", 0), ("max_num_seqs", True), ("connector_addr", "nohost"),
    ("connector_addr", "h:99999"), ("unknown_field", 1)])
def test_registration_refuses_bad_field_naming_it(field, value):
    """SERVICES §5: a heartbeat that breaks the contract is refused, and the error names the field."""
    data = reg(9000, "decode").model_dump()
    data[field] = value
    with pytest.raises(ValidationError) as info:
        Registration.model_validate(data)
    assert info.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_pd_role_requires_connector_addr(role):
    """SERVICES §6: P and D must name their connector, the router passes it in disaggregate_info."""
    data = reg(9000, role).model_dump()
    data["connector_addr"] = None
    with pytest.raises(ValidationError) as info:
        Registration.model_validate(data)
    assert info.value.errors()[0]["loc"] == ("connector_addr",)


def test_three_failures_make_unhealthy_and_two_successes_restore():
    """SERVICES §5: 3 consecutive failed checks -> unhealthy; 2 consecutive successes -> healthy again."""
    registry, _ = make(reg(1))
    key = "127.0.0.1:1"
    assert [registry.record_health(key, False) for _ in range(3)] == [None, None, "unhealthy"]
    with pytest.raises(NoHealthyTargetError):
        registry.choose("mixed", None)
    assert registry.record_health(key, True) is None  # one success is not enough
    assert registry.record_health(key, False) is None  # and a failure resets the successes
    assert [registry.record_health(key, True) for _ in range(2)] == [None, "healthy"]
    assert registry.choose("mixed", None).key == key


def test_failures_must_be_consecutive():
    """SERVICES §5: a success in between resets the failure count."""
    registry, _ = make(reg(1))
    key = "127.0.0.1:1"
    for ok in (False, False, True, False, False):
        assert registry.record_health(key, ok) is None
    assert registry.instances()[0].healthy


def test_heartbeat_does_not_restore_health():
    """SERVICES §5: only health checks move the health state; a live but failing process stays unhealthy."""
    registry, _ = make(reg(1))
    for _ in range(3):
        registry.record_health("127.0.0.1:1", False)
    assert registry.register(reg(1)) == "refreshed"
    assert not registry.instances()[0].healthy


def test_instance_dropped_after_three_missed_heartbeats():
    """SERVICES §5: an instance that stops registering for 3 intervals is dropped; others stay."""
    registry, clock = make(reg(1), reg(2))
    clock.now += 2.0
    registry.register(reg(2))
    clock.now += 1.0
    assert registry.drop_expired() == []  # instance 1 is exactly 3 intervals old: not yet
    clock.now += 0.01
    assert [inst.key for inst in registry.drop_expired()] == ["127.0.0.1:1"]
    assert [inst.key for inst in registry.instances()] == ["127.0.0.1:2"]


def test_changed_description_replaces_the_old_one():
    """SERVICES §5: a restarted instance at the same address with a new config is seen with the new hash."""
    registry, _ = make(reg(1, "decode", "h1"))
    assert registry.register(reg(1, "decode", "h2")) == "changed"
    assert registry.instances()[0].registration.config_hash == "h2"


def test_choice_is_least_outstanding_then_least_used():
    """SERVICES §5: least outstanding requests wins; equally loaded instances take turns."""
    registry, _ = make(reg(1), reg(2), reg(3))
    first = registry.choose("mixed", None)
    registry.acquire(first)
    second = registry.choose("mixed", None)
    registry.acquire(second)
    third = registry.choose("mixed", None)
    assert len({first.key, second.key, third.key}) == 3
    registry.acquire(third)
    registry.release(second)
    assert registry.choose("mixed", None) is second


def test_many_candidates_use_two_random_choices():
    """SERVICES §5: with many instances the choice samples two and takes the less loaded one."""
    n = EXACT_CHOICE_MAX_CANDIDATES + 4
    registry, _ = make(*(reg(port) for port in range(1, n + 1)), seed=7)
    busy = registry.instances()[0]
    for _ in range(5):
        registry.acquire(busy)
    picks = set()
    for _ in range(200):
        choice = registry.choose("mixed", None)
        assert choice is not busy
        picks.add(choice.key)
    assert len(picks) > 2  # random, not always the same idle instance


def test_model_filter_404_for_unknown_and_503_when_none_healthy():
    """SERVICES §3, §5: a model no registered instance serves is unknown (404); a served model without a
    healthy instance of the needed role is unavailable (503), as is any model while nothing is registered."""
    registry, _ = make(reg(1, model="fd-toy"), reg(2, model="fd-tiny"), reg(3, "prefill", model="fd-big"))
    assert registry.choose("mixed", "fd-tiny").key == "127.0.0.1:2"
    with pytest.raises(UnknownModelError):
        registry.choose("mixed", "gpt-4")
    with pytest.raises(NoHealthyTargetError):  # served, but only by a prefill instance
        registry.choose("mixed", "fd-big")
    for _ in range(3):
        registry.record_health("127.0.0.1:2", False)
    with pytest.raises(NoHealthyTargetError):
        registry.choose("mixed", "fd-tiny")
    empty, _ = make()
    with pytest.raises(NoHealthyTargetError):
        empty.choose("mixed", "fd-toy")


def test_pairs_only_equal_config_hashes():
    """SERVICES §5: P and D are paired only when their config hashes are equal; else no pair (503)."""
    registry, _ = make(reg(1, "prefill", "h1"), reg(2, "decode", "h2"), reg(3, "decode", "h1"),
                       reg(4, "prefill", "h3"))
    for _ in range(10):
        prefill, decode = registry.choose_pair(None)
        assert (prefill.key, decode.key) == ("127.0.0.1:1", "127.0.0.1:3")
        registry.acquire(decode)  # load does not override compatibility
    for _ in range(3):
        registry.record_health("127.0.0.1:3", False)
    with pytest.raises(NoHealthyTargetError, match="config_hash"):
        registry.choose_pair(None)


@pytest.mark.parametrize("stranger_role", ["prefill", "decode"])
def test_pair_never_uses_an_incompatible_instance_while_a_compatible_pair_exists(stranger_role):
    """SERVICES §5: an instance of another config hash registered first and idle loses to a compatible one that
    is busy: load and order never override compatibility (each side checked)."""
    stranger = reg(9, stranger_role, "h-other")
    registry, _ = make(stranger, reg(1, "prefill", "h1"), reg(2, "decode", "h1"))
    for inst in registry.instances()[1:]:
        for _ in range(3):
            registry.acquire(inst)
    for _ in range(5):
        prefill, decode = registry.choose_pair(None)
        assert (prefill.key, decode.key) == ("127.0.0.1:1", "127.0.0.1:2")
        assert prefill.registration.config_hash == decode.registration.config_hash == "h1"
        registry.acquire(prefill)
        registry.acquire(decode)


def test_default_interval_drops_after_three_intervals_not_three_seconds():
    """SERVICES §5 at the router's default --health-interval-secs (5 s): a silent instance stays for 3 intervals
    (15 s), then goes; and the app the launcher builds uses that interval."""
    interval = RouterSettings().health_interval_secs
    assert interval == 5.0
    clock = Clock()
    registry = Registry(interval, clock=clock)
    registry.register(reg(1))
    for elapsed in (3.5, 10.0, 3 * interval):
        clock.now = 100.0 + elapsed
        assert registry.drop_expired() == [], f"dropped after {elapsed} s"
    clock.now = 100.0 + 3 * interval + 0.01
    assert [inst.key for inst in registry.drop_expired()] == ["127.0.0.1:1"]
    assert create_app(RouterSettings()).state.registry.drop_after_s == 3 * interval


def test_pair_prefers_least_loaded_within_a_hash():
    """SERVICES §5: among compatible instances, each side is the least loaded."""
    registry, _ = make(reg(1, "prefill"), reg(2, "prefill"), reg(3, "decode"), reg(4, "decode"))
    prefill, decode = registry.choose_pair(None)
    registry.acquire(prefill)
    registry.acquire(decode)
    other_prefill, other_decode = registry.choose_pair(None)
    assert other_prefill is not prefill and other_decode is not decode


def test_no_instance_of_role_is_503():
    """SERVICES §5: with nothing healthy to send to, the router refuses at once."""
    registry, _ = make(reg(1, "prefill"))
    with pytest.raises(NoHealthyTargetError, match="mixed"):
        registry.choose("mixed", None)
    with pytest.raises(NoHealthyTargetError):
        registry.choose_pair(None)


def with_load(registration: Registration, free_slots: int, free_kv_blocks: int, total_kv_blocks: int = 64,
              num_waiting: int = 0) -> Registration:
    load = Load(free_slots=free_slots, total_slots=registration.max_num_seqs, free_kv_blocks=free_kv_blocks,
                total_kv_blocks=total_kv_blocks, num_waiting=num_waiting)
    return registration.model_copy(update={"load": load})


def test_a_heartbeat_whose_load_alone_moved_is_a_refresh_and_updates_the_load():
    """A heartbeat carries the engine's load; a new load is not a new description (no "changed" log), but the
    registry ranks by it from then on."""
    registry, _ = make(with_load(reg(1, "decode"), 4, 64))
    assert registry.register(with_load(reg(1, "decode"), 1, 64)) == "refreshed"
    assert registry.instances()[0].free_capacity == 1
    assert registry.register(with_load(reg(1, "decode"), 4, 15)) == "refreshed"   # 15 of 64 blocks: 0.94 slots
    assert registry.instances()[0].free_capacity == 0
    assert registry.register(with_load(reg(1, "decode", "h2"), 4, 64)) == "changed"


def test_decode_with_most_free_capacity_wins_and_a_full_one_loses_to_any_with_room():
    """D by most free decode capacity: free slots (its slots less the router's outstanding requests, at most what
    its heartbeat reports), fewer when its free KV blocks are less than that many slots' shares; a full D is
    chosen only when every D is full."""
    big = reg(2, "decode").model_copy(update={"max_num_seqs": 3})
    small = reg(3, "decode").model_copy(update={"max_num_seqs": 1})
    registry, _ = make(reg(1, "prefill"), small, big)
    chosen = []
    for _ in range(5):
        _, decode = registry.choose_pair(None)
        registry.acquire(decode)
        chosen.append(decode.registration.port)
    # 3 free vs 1, then 2 vs 1, then 1 vs 1 (the less recently used: the small one), then the big one: the small
    # one is full; then both are full and the least recently used gets it
    assert chosen == [2, 2, 3, 2, 3]
    registry, _ = make(reg(1, "prefill"), with_load(reg(2, "decode"), 4, 4), with_load(reg(3, "decode"), 4, 64))
    assert registry.choose_pair(None)[1].registration.port == 3   # D 2's blocks are a quarter of one slot's share
    assert registry.instances()[1].free_capacity == 0


def test_prefill_with_least_outstanding_prefill_work_wins_until_it_has_handed_off():
    """P by least outstanding prefill work: a P with one long prompt in flight loses to one with two short
    ones; once P has answered (handed off) its work no longer counts."""
    registry, _ = make(reg(1, "prefill"), reg(2, "prefill"), reg(3, "decode"))
    first, _ = registry.choose_pair(None)
    registry.acquire(first, prefill_work=prompt_size({"prompt": "x" * 300}))
    second, _ = registry.choose_pair(None)
    assert second is not first
    registry.acquire(second, prefill_work=prompt_size({"prompt": [1, 2, 3]}))
    registry.acquire(second, prefill_work=prompt_size({"messages": [{"role": "user", "content": "hello"}]}))
    assert registry.choose_pair(None)[0] is second
    registry.release(first, prefill_work=300)
    assert first.outstanding_prefill_work == 0
    assert registry.choose_pair(None)[0] is first


def test_prompt_size_measures_the_accepted_shapes_and_nothing_deeper():
    """Token ids count one each, text its characters, chat messages their contents (text or parts); a body
    nested deeper than the API accepts is measured only as deep as those shapes go (the instance refuses it)."""
    assert prompt_size({"prompt": "abcd"}) == 4
    assert prompt_size({"prompt": [5, 6, 7]}) == 3
    assert prompt_size({"prompt": ["ab", "c"]}) == 3
    assert prompt_size({"prompt": [[1, 2], [3]]}) == 3
    assert prompt_size({"messages": [{"role": "user", "content": "hi"},
                                     {"role": "user", "content": [{"type": "text", "text": "abc"}]}]}) == 5
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert prompt_size({"prompt": deep}) == 1
    assert prompt_size({"prompt": None}) == prompt_size({}) == prompt_size({"prompt": {"x": 1}}) == 0


def test_ties_go_to_the_least_recently_used_and_unreachable_ones_are_skipped():
    """Idle equals take turns (least recently used); an instance marked unreachable (it refused a connection) is
    skipped, and 503 is left when nothing else is."""
    registry, clock = make(reg(1, "prefill"), reg(2, "prefill"), reg(3, "decode"), reg(4, "decode"))
    pairs = []
    for _ in range(4):
        prefill, decode = registry.choose_pair(None)
        registry.acquire(prefill)
        registry.acquire(decode)
        registry.release(prefill)
        registry.release(decode)
        clock.now += 1
        pairs.append((prefill.registration.port, decode.registration.port))
    assert pairs == [(1, 3), (2, 4), (1, 3), (2, 4)]
    by_port = {inst.registration.port: inst for inst in registry.instances()}
    for port in (1, 3):
        registry.mark_unreachable(by_port[port])
    prefill, decode = registry.choose_pair(None)
    assert (prefill.registration.port, decode.registration.port) == (2, 4)
    registry.mark_unreachable(by_port[4])
    with pytest.raises(NoHealthyTargetError):
        registry.choose_pair(None)


def test_a_model_alias_routes_like_the_served_name():
    """`fastdeploy serve --pd --model DIR`: a client may send the DIR string as `model` through the router, as a
    single instance accepts it (its registration's model_aliases); other names stay unknown (404)."""
    alias = "/models/ckpt"
    registry, _ = make(reg(9001, "prefill", model="ckpt").model_copy(update={"model_aliases": [alias]}),
                       reg(9002, "decode", model="ckpt").model_copy(update={"model_aliases": [alias]}))
    assert [i.registration.port for i in registry.choose_pair(alias)] == [9001, 9002]
    assert [i.registration.port for i in registry.choose_pair("ckpt")] == [9001, 9002]
    with pytest.raises(UnknownModelError):
        registry.choose_pair("/models/other")


def test_a_registration_carries_the_model_path_as_an_alias_and_parses():
    from fastdeploy.entrypoints.openai.registration import registration
    from fastdeploy.entrypoints.openai.serve_args import build_parser
    args = build_parser().parse_args(["--model", "/models/ckpt", "--splitwise-role", "decode", "--host", "127.0.0.1"])
    body = registration(args, {"config_hash": "h", "connector_addr": "127.0.0.1:9100"})
    parsed = Registration.model_validate_json(json.dumps(body))
    assert parsed.model == "ckpt" and parsed.model_aliases == ["/models/ckpt"]
