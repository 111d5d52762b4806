"""O1 and O2 through the router: with PD services (router + P + D) for no speculation and MTP K = 1, 2 on fd-toy
and fd-tiny, and with two mixed services behind the router, the `openai` client gets the in-process `LLM`'s greedy
text, finish reason, token counts and speculation figures, streamed and not; the fd-toy workload holds the seed
scenarios, each answered with the right finish reason (SERVICES §8 "O1/O2 through services", "Seed scenarios";
PD_MTP_FLOW §10.1 O1, O2, O4)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.models import get_model
from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from tests.services import deployment as deploy


def skip_without_mooncake() -> None:
    reason = mooncake_unavailable_reason()
    if reason is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")

TOY = get_model("fd-toy")


@dataclass(frozen=True)
class Case:
    name: str
    prompt: str | list[int]
    max_tokens: int
    min_tokens: int = 0
    stop: list[str] | None = None


def toy_workload() -> list[Case]:
    """The O4 rows that an HTTP client can see, on fd-toy prompts found for them (PD_MTP_FLOW §10.1)."""
    boundary = TOY.find_prompt(eos_index=12, prompt_len=9, seed=61)
    t0, x1 = TOY.greedy_generate(boundary, 2)
    return [
        Case("eos_as_t0", TOY.find_prompt(0, 9, seed=1), 24),
        Case("eos_in_d_first_round", TOY.find_prompt(1, 9, seed=11), 24),
        Case("eos_as_bonus_of_d_first_round", TOY.find_prompt(2, 9, seed=12), 24),
        Case("eos_inside_a_run", TOY.find_prompt(5, 9, seed=21), 24),
        Case("max_tokens_1", TOY.find_prompt(5, 9, seed=31), 1),
        Case("max_tokens_2", TOY.find_prompt(8, 9, seed=41), 2),
        Case("min_tokens_over_eos", TOY.find_prompt(1, 9, seed=51), 20, min_tokens=4),
        Case("stop_spanning_t0_x1", boundary, 24, stop=[chr(t0) + chr(x1)]),
        Case("stop_at_t0", boundary, 24, stop=[chr(t0)]),
        Case("long_prompt", TOY.find_prompt(30, 70, seed=71), 40),
        Case("text_prompt", "On Monday, Judy", 24),
    ]


TINY_WORKLOAD = [Case("judy", "On Monday, Judy", 16), Case("cat_min_tokens", "The cat sat", 12, min_tokens=12)]
CASES = [("pd", "fd-toy", 0), ("pd", "fd-toy", 1), ("pd", "fd-toy", 2), ("pd", "fd-tiny", 0),
         ("pd", "fd-tiny", 1), ("pd", "fd-tiny", 2), ("mixed", "fd-toy", 1),
         ("pd-mooncake-tcp", "fd-tiny", 1), ("pd-mooncake-tcp", "fd-toy", 2)]
MOONCAKE = ("--cache-transfer-protocol", "mooncake-tcp")


def _spec(k: int) -> dict | None:
    return {"method": "mtp", "num_speculative_tokens": k} if k else None


@pytest.fixture(scope="module", params=CASES, ids=[f"{mode}-{m}-k{k}" for mode, m, k in CASES])
def case(request):
    mode, model, k = request.param
    workload = toy_workload() if model == "fd-toy" else TINY_WORKLOAD
    if mode == "mixed":
        deployment = deploy.mixed_deployment(model=model, k=k, wait=False)
    elif mode == "pd":
        deployment = deploy.pd_deployment(model=model, k=k, wait=False)
    else:   # the KV moves one-sided into D's blocks through the Mooncake transfer engine over TCP
        skip_without_mooncake()
        deployment = deploy.pd_deployment(model=model, k=k, prefill_flags=MOONCAKE, decode_flags=MOONCAKE,
                                          wait=False)
    try:
        llm = LLM(model=model, speculative_config=_spec(k))  # while the services start
        params = [SamplingParams(max_tokens=c.max_tokens, min_tokens=c.min_tokens, stop=c.stop) for c in workload]
        expected = llm.generate([c.prompt for c in workload], params, use_tqdm=False)
        deployment.await_ready()
        with deployment.client() as client:
            yield model, workload, expected, client, deployment
        deployment.wait_nothing_held()
    finally:
        deployment.stop()


def test_greedy_completions_through_router_equal_in_process_llm(case):
    """O1 + O2 via the router's /v1/completions: text, finish reason, token counts and speculation figures
    (decode rounds, drafts, accepted drafts) equal the in-process single instance's, request by request."""
    model, workload, expected, client, _ = case
    for c, want in zip(workload, expected):
        got = client.completions.create(model=model, prompt=c.prompt, max_tokens=c.max_tokens, temperature=0,
                                        stop=c.stop, extra_body={"min_tokens": c.min_tokens})
        choice, spec = got.choices[0], got.model_extra["spec_decode"]
        assert (choice.text, choice.finish_reason) == (want.outputs.text, want.outputs.finish_reason), c.name
        assert got.usage.completion_tokens == len(want.outputs.token_ids), c.name
        assert (spec["num_decode_rounds"], spec["num_draft_tokens"], spec["num_accepted_drafts"]) == (
            want.metrics.num_decode_rounds, want.metrics.num_draft_tokens, want.metrics.num_accepted_drafts), \
            f"O2: {c.name}"


def test_streamed_through_router_equals_in_process_text(case):
    """O1 streamed through the router: the deltas concatenate to the in-process text, exactly one stream
    reaches the client (one id, one final chunk), the finish reason is on the last chunk."""
    model, workload, expected, client, _ = case
    for c, want in zip(workload, expected):
        chunks = list(client.completions.create(model=model, prompt=c.prompt, max_tokens=c.max_tokens,
                                                temperature=0, stop=c.stop, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body={"min_tokens": c.min_tokens}))
        text_chunks = [chunk for chunk in chunks if chunk.choices]
        assert "".join(chunk.choices[0].text for chunk in text_chunks) == want.outputs.text, c.name
        assert [chunk.choices[0].finish_reason for chunk in text_chunks] == \
            [None] * (len(text_chunks) - 1) + [want.outputs.finish_reason], c.name
        assert len({chunk.id for chunk in chunks}) == 1
        assert chunks[-1].usage.completion_tokens == len(want.outputs.token_ids)


def test_seed_scenarios_finish_with_the_expected_reason(case):
    """O4 through HTTP: EOS as t0 and in D's first round stop at once, max_tokens 1 and 2 give exactly that many
    tokens, min_tokens pushes EOS past its natural position, and a stop string spanning t0 and x1 (the P/D
    boundary) or equal to t0 ends the output before it (PD_MTP_FLOW §10.1 O4)."""
    model, workload, expected, client, _ = case
    if model != "fd-toy":
        pytest.skip("the seed scenarios are built on fd-toy prompts")
    results = {c.name: client.completions.create(model=model, prompt=c.prompt, max_tokens=c.max_tokens,
                                                 temperature=0, stop=c.stop,
                                                 extra_body={"min_tokens": c.min_tokens})
               for c in workload}
    usage = {name: (r.choices[0].finish_reason, r.usage.completion_tokens) for name, r in results.items()}
    assert usage["eos_as_t0"] == ("stop", 1)
    assert usage["eos_in_d_first_round"] == ("stop", 2)
    assert usage["eos_as_bonus_of_d_first_round"] == ("stop", 3)
    assert usage["eos_inside_a_run"] == ("stop", 6)
    assert usage["max_tokens_1"] == ("length", 1)
    assert usage["max_tokens_2"] == ("length", 2)
    assert usage["min_tokens_over_eos"][1] >= 4
    for name in ("stop_spanning_t0_x1", "stop_at_t0"):
        assert (results[name].choices[0].text, results[name].choices[0].finish_reason) == ("", "stop"), name
