"""SGLang's fields as the API server maps them, without processes (docs/serving.md, "Request fields"; docs/design.md
§8, "sglang-router"): the bootstrap fields give P and D the same `disaggregate_info` (engine id from the room, P's
connector at bootstrap_host:bootstrap_port), every malformed combination is a 400 naming the field, a mixed
instance ignores them; `ignore_eos` and `no_stop_trim` reach SamplingParams, `return_hidden_states` is refused."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from fastdeploy.entrypoints.chat_template import ChatTemplate
from fastdeploy.entrypoints.openai.errors import APIError, validation_error
from fastdeploy.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from fastdeploy.entrypoints.openai.serve_args import build_parser, check_args
from fastdeploy.entrypoints.openai.serving_engine import OpenAIServing, ServingSettings
from fastdeploy.engine.core_client import EngineDeadError
from fastdeploy.entrypoints.openai.serving_completion import CompletionFormat, completion_prompts
from fastdeploy.entrypoints.openai.sglang_compat import bootstrap_pairing
from fastdeploy.metrics.metrics import ServerMetrics
from fastdeploy.model_executor.models.tokenizer import get_tokenizer

P_PORT = 9000
ROUTED = {"bootstrap_host": "127.0.0.1", "bootstrap_port": P_PORT, "bootstrap_room": 42}


def _request(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": "Hello", **fields})


def _serving(role: str, client=None) -> OpenAIServing:
    client = client or SimpleNamespace(ready_info={"connector_addr": f"127.0.0.1:{P_PORT}"} if role == "prefill"
                                       else {})
    settings = ServingSettings(model_names=("fd-toy",), role=role, max_model_len=512, max_concurrency=None,
                               max_body_bytes=1 << 20)
    return OpenAIServing(client, get_tokenizer("fd-toy"), ChatTemplate(), ServerMetrics(), settings)


@pytest.mark.parametrize("fields,want", [
    (ROUTED, {"request_id": "sglang-room-42", "prefill_addr": f"127.0.0.1:{P_PORT}"}),
    ({"bootstrap_host": ["10.0.0.7"] * 2, "bootstrap_port": [P_PORT] * 2, "bootstrap_room": [5, 6]},
     {"request_id": "sglang-room-5", "prefill_addr": f"10.0.0.7:{P_PORT}"}),
    ({**ROUTED, "bootstrap_host": "::1"}, {"request_id": "sglang-room-42", "prefill_addr": f"[::1]:{P_PORT}"}),
    ({**ROUTED, "bootstrap_host": "[fe80::2]", "bootstrap_room": (1 << 64) - 1},
     {"request_id": f"sglang-room-{(1 << 64) - 1}", "prefill_addr": f"[fe80::2]:{P_PORT}"}),
], ids=["single", "one-room-per-prompt", "ipv6", "bracketed-ipv6-largest-room"])
def test_p_and_d_derive_the_same_pairing_from_the_bootstrap_fields(fields, want):
    for role in ("prefill", "decode"):
        assert _serving(role).pairing(_request(**fields)) == want


class _StaysConnected:
    """The HTTP request as D's serving layer watches it while it waits for P's hand-off: a client that stays."""

    async def receive(self) -> dict:
        await asyncio.Event().wait()


def _submitted(role: str, fields: dict) -> list[tuple[str, dict]]:
    """(engine request id, disaggregate_info) of every AddRequest the `role` instance's serving layer hands its
    engine for a completion with `fields` (the engine then refuses, so nothing else runs)."""
    submitted = []

    async def generate(message):
        submitted.append((message.request_id, message.disaggregate_info))
        raise EngineDeadError("test: nothing runs")
        yield   # an async generator, as EngineCoreClient.generate is

    client = SimpleNamespace(is_ready=True, state="ready", dead_reason=None, generate=generate,
                             ready_info={"connector_addr": f"127.0.0.1:{P_PORT}"} if role == "prefill" else {})
    serving = _serving(role, client)
    request = _request(max_tokens=4, **fields)
    prompts, _ = completion_prompts(serving, request.prompt)
    params, stop_seqs = serving.sampling(request, request.max_tokens)
    with pytest.raises(APIError) as caught:
        asyncio.run(serving.generate(_StaysConnected(), request, prompts, params, stop_seqs, "cmpl",
                                     CompletionFormat("fd-toy"), "prompt"))
    assert caught.value.status == 503
    return submitted


@pytest.mark.parametrize("fields,ids", [
    (ROUTED, ["sglang-room-42"]),
    ({**ROUTED, "n": 2}, ["sglang-room-42-0", "sglang-room-42-1"]),
    ({"prompt": ["Hello", "Bye"], "bootstrap_host": ["127.0.0.1"] * 2, "bootstrap_port": [P_PORT] * 2,
      "bootstrap_room": [5, 6]}, ["sglang-room-5-0", "sglang-room-5-1"]),
], ids=["single", "n-2", "two-prompts"])
def test_p_and_d_submit_the_same_engine_ids_derived_from_the_room(fields, ids):
    """What P and D hand their engines, not only what `pairing()` returns: the same engine request ids, derived
    from the room, each with a disaggregate_info naming that id and P's connector (docs/design.md §8)."""
    on_p, on_d = _submitted("prefill", fields), _submitted("decode", fields)
    assert [rid for rid, _ in on_p] == [rid for rid, _ in on_d] == ids
    for rid, info in on_p + on_d:
        assert info == {"request_id": rid, "prefill_addr": f"127.0.0.1:{P_PORT}"}


@pytest.mark.parametrize("fields,param", [
    ({"bootstrap_room": 42}, "bootstrap_host"),
    ({"bootstrap_host": "127.0.0.1", "bootstrap_room": 42}, "bootstrap_port"),
    ({**ROUTED, "bootstrap_room": [1, 2]}, "bootstrap_room"),
    ({"bootstrap_host": ["a", "b"], "bootstrap_port": [P_PORT] * 2, "bootstrap_room": [1, 2]}, "bootstrap_host"),
    ({"bootstrap_host": ["a"] * 2, "bootstrap_port": [P_PORT, P_PORT + 1], "bootstrap_room": [1, 2]},
     "bootstrap_port"),
    ({**ROUTED, "bootstrap_host": "http://127.0.0.1"}, "bootstrap_host"),
    ({**ROUTED, "bootstrap_host": "a b"}, "bootstrap_host"),
    ({**ROUTED, "bootstrap_host": "[::1"}, "bootstrap_host"),
    ({**ROUTED, "bootstrap_host": ":"}, "bootstrap_host"),
    ({**ROUTED, "bootstrap_host": "p.example"}, "bootstrap_host"),
    ({**ROUTED, "disaggregate_info": {"request_id": "x", "prefill_addr": "127.0.0.1:1"}}, "bootstrap_room"),
], ids=["room-only", "no-port", "lengths-differ", "two-hosts", "two-ports", "url-not-host", "space", "open-bracket", "colon-only",
        "host-name", "two-pairing-schemes"])
def test_malformed_bootstrap_fields_are_a_400_naming_the_field(fields, param):
    for role in ("prefill", "decode"):
        with pytest.raises(APIError) as caught:
            _serving(role).pairing(_request(**fields))
        assert (caught.value.status, caught.value.param) == (400, param), caught.value.message


def test_p_refuses_a_bootstrap_port_other_than_its_connector_port():
    with pytest.raises(APIError) as caught:
        bootstrap_pairing(_request(**{**ROUTED, "bootstrap_port": P_PORT + 1}), own_connector_port=P_PORT)
    assert caught.value.param == "bootstrap_port" and f"'--prefill <this URL> {P_PORT}'" in caught.value.message
    assert _serving("decode").pairing(_request(**{**ROUTED, "bootstrap_port": P_PORT + 1})) is not None


@pytest.mark.parametrize("field,value", [("bootstrap_port", 0), ("bootstrap_port", 65536), ("bootstrap_room", -1),
                                         ("bootstrap_room", 1 << 64), ("bootstrap_host", ""),
                                         ("bootstrap_room", []), ("bootstrap_port", "9000")])
def test_out_of_range_bootstrap_values_fail_validation_naming_the_field(field, value):
    with pytest.raises(ValidationError) as caught:
        _request(**{**ROUTED, field: value})
    assert validation_error(caught.value, CompletionRequest).param == field


def test_a_mixed_instance_ignores_the_bootstrap_fields_and_pd_instances_need_a_pairing():
    assert _serving("mixed").pairing(_request(**ROUTED)) is None
    for role in ("prefill", "decode"):
        with pytest.raises(APIError, match="send requests to the router"):
            _serving(role).pairing(_request())


def test_sglang_sampling_fields_reach_sampling_params():
    serving = _serving("mixed")
    params, _ = serving.sampling(_request(ignore_eos=True, no_stop_trim=True, skip_special_tokens=False), 8)
    assert params.ignore_eos and params.include_stop_str_in_output
    params, _ = serving.sampling(_request(ignore_eos=False, no_stop_trim=False, stop=["x"]), 8)
    assert not params.ignore_eos and not params.include_stop_str_in_output
    with pytest.raises(APIError) as caught:
        serving.sampling(_request(ignore_eos=True, stop=["x"]), 8)
    assert caught.value.param == "ignore_eos"


def test_return_hidden_states_is_refused_and_reasoning_flags_accepted():
    assert [name for name, _ in _request(return_hidden_states=True).refused_fields()] == ["return_hidden_states"]
    assert _request(return_hidden_states=False).refused_fields() == []
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}],
                                                 "separate_reasoning": True, "stream_reasoning": True,
                                                 "skip_special_tokens": True, "no_stop_trim": False})
    assert chat.refused_fields() == []


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_pd_roles_start_without_a_router(role):
    """Behind sglang-router neither half registers anywhere: D learns its P from each request."""
    assert check_args(build_parser().parse_args(["--splitwise-role", role, "--pd-comm-port", "9000"])) is None
    assert check_args(build_parser().parse_args(["--splitwise-role", role])) is None
