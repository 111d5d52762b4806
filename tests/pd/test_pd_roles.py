"""The PD roles as the engine core builds them (SERVICES §2, §5, §6): `--splitwise-role prefill|decode` gives one
LLMEngine with that role's KV connector over ZeroMQ, its registration satisfies the router's contract, each role
refuses at admission what it cannot serve, and `disaggregate_info` is validated with errors naming the field."""
from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib

import pytest

from fastdeploy.engine.connector.base import DisaggregateInfo
from fastdeploy.engine.connector.decode import DecodeConnector
from fastdeploy.engine.connector.prefill import PrefillConnector
from fastdeploy.engine.engine import LLMEngine
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.entrypoints.instance_builder import build_instance
from fastdeploy.entrypoints.openai.registration import registration
from fastdeploy.entrypoints.openai.serve_args import check_args, parse_args
from fastdeploy.router.protocol import Registration
from fastdeploy.splitwise.mooncake import STAGING_SLOTS, mooncake_unavailable_reason

SPEC = '{"method": "mtp", "num_speculative_tokens": 1}'


def role_args(role: str, *extra: str):
    return parse_args(["--model", "fd-toy", "--host", "127.0.0.1", "--port", "8181", "--splitwise-role", role,
                       "--router", "127.0.0.1:9", "--speculative-config", SPEC, *extra])


def test_prefill_and_decode_roles_build_one_engine_with_their_connector_over_zeromq():
    """SERVICES §2: each role is an LLMEngine with its connector bound; P and D describe equal config hashes."""
    built = [build_instance(role_args("prefill")), build_instance(role_args("decode"))]   # free connector ports
    try:
        prefill, decode = built
        assert type(prefill) is LLMEngine and type(decode) is LLMEngine
        assert isinstance(prefill.connector, PrefillConnector) and isinstance(decode.connector, DecodeConnector)
        described = [instance.describe() for instance in built]
        assert [d["role"] for d in described] == ["prefill", "decode"]
        assert described[0]["config_hash"] == described[1]["config_hash"]
        for d in described:
            host, _, port = d["connector_addr"].rpartition(":")
            assert host == "127.0.0.1" and int(port) > 0
    finally:
        for instance in built:
            instance.close()


@pytest.mark.parametrize("role, extra, refused", [
    ("prefill", (), "--mooncake-staging-slots needs"),                                        # over ZeroMQ
    ("decode", ("--cache-transfer-protocol", "mooncake-tcp"), "--mooncake-staging-slots needs"),
    ("prefill", ("--cache-transfer-protocol", "mooncake-tcp"), "must be >= 0"),
])
def test_mooncake_staging_slots_outside_p_with_mooncake_is_a_one_line_error(role, extra, refused):
    if extra and (reason := mooncake_unavailable_reason()) is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    args = role_args(role, *extra)
    args.mooncake_staging_slots = -1 if refused == "must be >= 0" else 2
    assert refused in check_args(args)


@pytest.mark.parametrize("slots, want", [(None, STAGING_SLOTS), ("0", None), ("2", 2)])
def test_mooncake_staging_slots_sizes_p_staging_pool(slots, want):
    """SERVICES §7: P's staging pool has --mooncake-staging-slots slots (default 4); 0 has none, so P writes from
    its KV blocks in place."""
    if (reason := mooncake_unavailable_reason()) is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    flags = ("--cache-transfer-protocol", "mooncake-tcp") + (("--mooncake-staging-slots", slots) if slots else ())
    args = role_args("prefill", *flags)
    assert check_args(args) is None
    prefill = build_instance(args)
    try:
        staging = prefill.connector.kv_transfer.staging
        assert (staging.slots if staging is not None else None) == want
    finally:
        prefill.close()


def test_the_mooncake_segment_is_registered_under_the_advertised_address():
    """SERVICES §5, §7: D's transfer engine runs under the address it advertises (here `--advertise-host 127.0.0.2`,
    a loopback alias every Linux host has), so the session its reservations name is one P can reach."""
    if (reason := mooncake_unavailable_reason()) is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    decode = build_instance(role_args("decode", "--cache-transfer-protocol", "mooncake-tcp",
                                      "--advertise-host", "127.0.0.2"))
    try:
        assert decode.connector.kv_transfer.engine.session_address.rpartition(":")[0] == "127.0.0.2"
    finally:
        decode.close()


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_registration_satisfies_the_routers_contract(role):
    """SERVICES §5: the heartbeat body validates against the router's strict Registration model."""
    info = {"role": role, "connector_addr": "0.0.0.0:5555", "config_hash": "abc123"}
    body = registration(role_args(role), info)
    parsed = Registration.model_validate(body)
    assert (parsed.role, parsed.host, parsed.port, parsed.connector_addr, parsed.config_hash) == \
        (role, "127.0.0.1", 8181, "127.0.0.1:5555", "abc123")


def test_registration_reports_the_installed_distributions_version():
    """SERVICES §5: the version is that of the distribution pyproject.toml names (not "0+source" when installed)."""
    pyproject = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
    name = tomllib.loads(pyproject.read_text())["project"]["name"]
    body = registration(role_args("prefill"), {"connector_addr": "127.0.0.1:5555", "config_hash": "h"})
    assert body["version"] == importlib.metadata.version(name)


def test_wildcard_host_is_advertised_as_a_reachable_address():
    """SERVICES §5: peers cannot reach 0.0.0.0; the registration names this machine instead."""
    body = registration(parse_args(["--host", "0.0.0.0", "--splitwise-role", "prefill", "--router", "r:1"]),
                        {"connector_addr": "0.0.0.0:7000", "config_hash": "h"})
    assert body["host"] not in ("0.0.0.0", "") and body["connector_addr"] == f"{body['host']}:7000"


def test_pd_flags_without_a_pd_role_or_an_unusable_secret_are_refused(tmp_path):
    """SERVICES §2: contradictory flags, or a secret file that is empty, are a one-line error."""
    args = parse_args(["--model", "fd-toy"])
    args.pd_secret_file = str(tmp_path / "secret")
    assert "--pd-secret-file" in check_args(args)
    (tmp_path / "secret").write_text("\n")
    args.splitwise_role = "prefill"
    assert "is empty" in check_args(args)


@pytest.mark.parametrize("info, field", [
    ("not a dict", "must be an object"),
    ({"request_id": "other"}, "'request_id'"),
    ({"prefill_addr": "nowhere"}, "'prefill_addr'"),
    ({"decode_addr": "h:99999"}, "'decode_addr'"),
    ({"prefill_addr": "h:1", "extra": 1}, "unknown field"),
])
def test_disaggregate_info_errors_name_the_field(info, field):
    """SERVICES §3/§6: a bad disaggregate_info is a ValueError (HTTP 400) naming the field."""
    with pytest.raises(ValueError, match=field):
        DisaggregateInfo.parse(info, "r1")


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_plain_request_to_a_pd_instance_is_refused_at_admission_holding_nothing(role):
    """One admission path: a request without pairing information (sent past the router) is refused by the role's
    connector before anything is allocated, with an error that says where to send it; the instance stays usable."""
    instance = build_instance(role_args(role))
    try:
        with pytest.raises(ValueError, match="send requests to the router"):
            instance.add_request("plain", [1, 2, 3], SamplingParams())
        assert not instance.has_unfinished() and instance.stats().free_slots == instance.stats().total_slots
        assert instance.step() == []
    finally:
        instance.close()


def test_a_handoff_request_on_a_mixed_instance_is_refused_at_admission():
    """A mixed instance has no peer: `disaggregate_info` is refused at admission, naming the field."""
    instance = build_instance(parse_args(["--model", "fd-toy"]))
    with pytest.raises(ValueError, match="'disaggregate_info' is only for prefill and decode instances"):
        instance.add_request("r1", [1, 2, 3], SamplingParams(), disaggregate_info={"request_id": "r1"})
    assert not instance.has_unfinished()


def test_bad_disaggregate_info_fails_add_request_and_holds_nothing():
    """A bad request fails alone: ValueError at add_request, nothing reserved."""
    decode = build_instance(role_args("decode"))
    try:
        with pytest.raises(ValueError, match="'prefill_addr'"):
            decode.add_request("r1", [1, 2, 3], SamplingParams(), disaggregate_info={"prefill_addr": "x"})
        assert not decode.has_unfinished()
    finally:
        decode.close()


def test_pd_counters_become_prometheus_metrics():
    """SERVICES §4: hand-offs sent/received, refused by reason, KV bytes, held blocks and the hand-off latency
    reach /metrics; cumulative engine counts advance the counters by their difference."""
    from prometheus_client.parser import text_string_to_metric_families

    from fastdeploy.schema.core_protocol import EngineStats
    from fastdeploy.metrics.metrics import ServerMetrics

    metrics = ServerMetrics()
    base = dict(num_running=0, num_waiting=0, free_slots=1, total_slots=1, free_kv_blocks=4, total_kv_blocks=4)
    for sent, refused in ((2, 1), (5, 3)):
        metrics.set_stats(EngineStats(**base, pd={"handoffs_sent": sent, "kv_bytes_sent": 100 * sent,
                                                  "refused": {"bad_tag": refused}, "held_blocks": sent,
                                                  "handoff_latency_s": [0.01]}))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}
    assert samples[("fastdeploy:pd_handoffs_total", (("direction", "sent"),))] == 5
    assert samples[("fastdeploy:pd_kv_bytes_total", (("direction", "sent"),))] == 500
    assert samples[("fastdeploy:pd_messages_refused_total", (("reason", "bad_tag"),))] == 3
    assert samples[("fastdeploy:pd_held_kv_blocks", ())] == 5
    assert samples[("fastdeploy:pd_handoff_latency_seconds_count", ())] == 2


def test_pd_timeout_sets_every_handoff_deadline():
    """docs/design.md §8: --pd-timeout-secs bounds every wait; the reservation match outlasts the allocation."""
    from fastdeploy.entrypoints.instance_builder import pd_deadlines

    deadlines = pd_deadlines(2.0)
    assert (deadlines.decode_allocation_s, deadlines.kv_transfer_s, deadlines.prefill_result_s,
            deadlines.reservation_s) == (2.0, 2.0, 2.0, 3.0)
    assert "--pd-timeout-secs" in check_args(_mixed_with_timeout())


def test_pd_min_transfer_mbps_sets_the_floor_rate_and_is_checked():
    """SERVICES §6: --pd-min-transfer-mbps is the floor rate the hand-off's deadlines are scaled at; a mixed
    instance or a value <= 0 is a one-line error."""
    from fastdeploy.entrypoints.instance_builder import pd_deadlines

    assert pd_deadlines(None, None, 8.0).min_transfer_mbps == 8.0
    assert pd_deadlines(2.0).min_transfer_mbps == 100.0
    mixed, prefill = parse_args(["--model", "fd-toy"]), role_args("prefill")
    mixed.pd_min_transfer_mbps, prefill.pd_min_transfer_mbps = 5.0, 0.0
    assert "--pd-min-transfer-mbps" in check_args(mixed)
    assert "--pd-min-transfer-mbps must be > 0" in check_args(prefill)
    assert role_args("decode", "--pd-min-transfer-mbps", "5").pd_min_transfer_mbps == 5.0


def _mixed_with_timeout():
    args = parse_args(["--model", "fd-toy"])
    args.pd_timeout_secs = 1.0
    return args
