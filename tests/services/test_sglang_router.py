"""PD behind the real sglang-router (docs/design.md §8, "sglang-router"; docs/serving.md): a P and a D API server
started without `--router`, paired by sglang-router's bootstrap fields, give the `openai` client the in-process
`LLM`'s greedy text (single and splitwise agree), for completions and chat, streamed and not, several prompts and
samples included; SGLang's `ignore_eos` is applied; the probe endpoints tell the router each instance's model and
role; a D whose engine core is killed mid-stream ends the client's stream with an error, and P holds nothing.

One deployment per configuration (fd-tiny with MTP K = 1, fd-toy without speculation); the D-kill test runs last.
"""
from __future__ import annotations

import os
import signal

import httpx
import openai
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.models import get_model
from tests.services import launcher
from tests.services.sglang_deployment import MAX_MODEL_LEN, start_deployment

pytest.importorskip("sglang_router", reason="sglang-router is not installed (pip install -e \".[router]\")")

TOY = get_model("fd-toy")
# fd-toy ends this prompt with EOS as its second token: the ignore_eos case (a printable-byte prompt as text)
EARLY_EOS = "".join(chr(t) for t in TOY.find_prompt(1, 9, seed=11)[1:])
PROMPTS = ["On Monday, Judy", "The cat sat", EARLY_EOS]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
CHAT_TEXT = "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n"      # the built-in template, written out
MAX_TOKENS = 12
CONFIGS = [("fd-tiny", 1), ("fd-toy", 0)]


@pytest.fixture(scope="module", params=CONFIGS, ids=[f"{m}-k{k}" for m, k in CONFIGS])
def served(request, tmp_path_factory):
    """(model, deployment, oracle): the oracle maps (prompt, ignore_eos) to the in-process output, checked equal
    between `LLM()` and `LLM(splitwise=True)` first."""
    model, k = request.param
    deployment = start_deployment(model, k, tmp_path_factory.mktemp(f"sglang-{model}-k{k}"))
    try:
        spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
        prompts = PROMPTS + [CHAT_TEXT]
        oracle = {}
        for ignore_eos in (False, True):
            params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=ignore_eos)
            single, split = (LLM(model=model, speculative_config=spec, splitwise=s).generate(
                prompts, params, use_tqdm=False) for s in (False, True))
            assert [o.outputs.token_ids for o in single] == [o.outputs.token_ids for o in split]
            oracle.update({(p, ignore_eos): o.outputs for p, o in zip(prompts, single)})
        deployment.await_ready()
        yield model, deployment, oracle
        alive = [deployment.prefill] + ([deployment.decode] if _healthy(deployment.decode) else [])
        for server in alive:     # D is down after the kill test
            server.wait_until(launcher.nothing_held, "nothing held", timeout_s=30)
    finally:
        deployment.stop()


def _healthy(server: launcher.Server) -> bool:
    try:
        return server.health() == 200
    except httpx.HTTPError:
        return False


def _stream_text(chunks) -> tuple[str, str | None]:
    text, finish = [], None
    for chunk in chunks:
        for choice in chunk.choices:
            text.append(getattr(choice, "text", None) or getattr(getattr(choice, "delta", None), "content", "")
                        or "")
            finish = choice.finish_reason or finish
    return "".join(text), finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_through_sglang_router_equal_in_process_llm(served, stream):
    model, deployment, oracle = served
    with deployment.client() as client:
        for prompt in PROMPTS:
            want = oracle[(prompt, False)]
            got = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, stream=stream)
            if stream:
                assert _stream_text(got) == (want.text, want.finish_reason)
            else:
                assert (got.choices[0].text, got.choices[0].finish_reason) == (want.text, want.finish_reason)
                assert got.usage.completion_tokens == len(want.token_ids)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_through_sglang_router_equals_in_process_llm(served, stream):
    """sglang-router turns `max_tokens` into `max_completion_tokens` and adds SGLang's chat fields; the text is
    the template-rendered prompt's."""
    model, deployment, oracle = served
    want = oracle[(CHAT_TEXT, False)]
    with deployment.client() as client:
        got = client.chat.completions.create(model=model, messages=CHAT, max_tokens=MAX_TOKENS, stream=stream)
        if stream:
            assert _stream_text(got) == (want.text, want.finish_reason)
        else:
            assert (got.choices[0].message.content, got.choices[0].finish_reason) == (want.text, want.finish_reason)


def test_several_prompts_and_samples_pair_by_room(served):
    """A list of prompts gets one bootstrap room per prompt, chat `n` one per sample: P and D derive the same
    `<id>-<index>` engine ids from the first room, and every choice is the greedy text."""
    model, deployment, oracle = served
    with deployment.client() as client:
        got = client.completions.create(model=model, prompt=PROMPTS[:2], n=2, max_tokens=MAX_TOKENS)
        texts = [c.text for c in sorted(got.choices, key=lambda c: c.index)]
        assert texts == [oracle[(PROMPTS[0], False)].text] * 2 + [oracle[(PROMPTS[1], False)].text] * 2
        chat = client.chat.completions.create(model=model, messages=CHAT, n=3, max_tokens=MAX_TOKENS)
        assert sorted(c.index for c in chat.choices) == [0, 1, 2]
        assert {c.message.content for c in chat.choices} == {oracle[(CHAT_TEXT, False)].text}


def test_ignore_eos_runs_past_eos_through_sglang_router(served):
    """SGLang's `ignore_eos`: the model's EOS does not end the request (fd-toy's prompt ends at EOS without it)."""
    model, deployment, oracle = served
    plain, ignoring = oracle[(EARLY_EOS, False)], oracle[(EARLY_EOS, True)]
    assert model != "fd-toy" or (plain.finish_reason, len(plain.token_ids)) == ("stop", 2)
    with deployment.client() as client:
        got = client.completions.create(model=model, prompt=EARLY_EOS, max_tokens=MAX_TOKENS,
                                        extra_body={"ignore_eos": True})
    assert (got.choices[0].text, got.choices[0].finish_reason) == (ignoring.text, "length")
    assert got.usage.completion_tokens == MAX_TOKENS


def test_probe_endpoints_give_the_router_model_and_role(served):
    """/server_info and /model_info (and their older `get_` names) answer what sglang-router reads; the router
    lists P with its bootstrap port and both under the served model name."""
    model, deployment, _ = served
    for server, role in ((deployment.prefill, "prefill"), (deployment.decode, "decode")):
        for path in ("/server_info", "/get_server_info"):
            info = httpx.get(server.url + path, timeout=5).json()
            assert (info["served_model_name"], info["disaggregation_mode"]) == (model, role)
            assert info["max_total_num_tokens"] > 0 and info["model_path"] is None
        assert info["disaggregation_bootstrap_port"] == (deployment.connector_port if role == "prefill" else None)
        for path in ("/model_info", "/get_model_info"):
            assert httpx.get(server.url + path, timeout=5).json()["is_generation"] is True
    workers = {w["worker_type"]: w for w in deployment.workers()}
    assert {w["model_id"] for w in workers.values()} == {model}
    assert workers["prefill"]["bootstrap_port"] == deployment.connector_port
    assert workers["decode"]["metadata"]["disaggregation_mode"] == "decode"


def test_p_refuses_a_bootstrap_port_that_is_not_its_connector(served):
    """A router given another bootstrap port would send D to an address no P listens on: P says so at once."""
    _, deployment, _ = served
    body = {"prompt": "Hello", "max_tokens": 4, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": deployment.connector_port + 1, "bootstrap_room": 7}
    response = httpx.post(deployment.prefill.url + "/v1/completions", json=body, timeout=10)
    assert response.status_code == 400 and response.json()["error"]["param"] == "bootstrap_port", response.text
    assert f"--prefill <this URL> {deployment.connector_port}" in response.json()["error"]["message"]


def test_d_killed_mid_stream_ends_the_stream_with_an_error(served):
    """SIGKILL D's engine core while it streams: the client's stream ends with an error (D's API server sends an
    error event, sglang-router relays it), never a hang or a clean finish; P holds nothing afterwards. Last test
    of its deployment: D stays down."""
    model, deployment, _ = served
    long = MAX_MODEL_LEN - len(PROMPTS[0]) - 8
    with deployment.client() as client:
        stream = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=long, stream=True,
                                           extra_body={"min_tokens": long})
        finish = None
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            for i, chunk in enumerate(stream):
                if i == 0:
                    os.kill(deployment.decode.engine_core_pid(), signal.SIGKILL)
                finish = chunk.choices[0].finish_reason if chunk.choices else finish
        assert finish is None, "D finished before its engine core was killed"
    deployment.prefill.wait_until(launcher.nothing_held, "nothing held on P", timeout_s=30)
    # D's API server answers /health 503 without its engine core, or exits for a supervisor to restart it
    deployment.decode.wait_until(lambda s: not _healthy(s), "D no longer healthy", timeout_s=30, server_alive=False)
