"""O1 and O2 through HTTP for one mixed instance: greedy outputs and per-request acceptance figures equal the
in-process LLM's, streamed and not, for no speculation and MTP K = 1, 2 on fd-toy and fd-tiny (SERVICES §8
"O1 through services", "O2 through services"; PD_MTP_FLOW §10)."""
from __future__ import annotations

import json

import pytest
from openai import OpenAI

from fastdeploy import LLM, SamplingParams
from tests.services import launcher

# (prompt, max_tokens, min_tokens, stop); fd-tiny gets the first two only (it is ~20x slower per token)
WORKLOAD = [("On Monday, Judy", 24, 0, None), ("The cat sat", 16, 16, None), ("Hello there", 1, 0, None),
            ("Once upon a time", 2, 0, None), ("abc abc abc", 24, 4, ["e", "a "]), ("Why is the sky", 20, 0, None)]
CASES = [("fd-toy", 0), ("fd-toy", 1), ("fd-toy", 2), ("fd-tiny", 0), ("fd-tiny", 1), ("fd-tiny", 2)]


def _spec(k: int) -> dict | None:
    return {"method": "mtp", "num_speculative_tokens": k} if k else None


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-k{k}" for m, k in CASES])
def case(request):
    model, k = request.param
    workload = WORKLOAD if model == "fd-toy" else WORKLOAD[:2]
    flags = ["--speculative-config", json.dumps(_spec(k))] if k else []
    with launcher.serving(*flags, model=model, wait_ready=False) as server:
        llm = LLM(model=model, speculative_config=_spec(k))   # while the server starts
        params = [SamplingParams(max_tokens=n, min_tokens=m, stop=stop) for _, n, m, stop in workload]
        expected = llm.generate([p for p, *_ in workload], params, use_tqdm=False)
        launcher.await_ready(server)
        client = OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0, timeout=60)
        yield model, workload, expected, client


def test_greedy_completions_equal_in_process_llm(case):
    """O1 + O2 via /v1/completions: text, finish reason, token count and speculation figures are the LLM's."""
    model, workload, expected, client = case
    for (prompt, max_tokens, min_tokens, stop), want in zip(workload, expected):
        got = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                        stop=stop, extra_body={"min_tokens": min_tokens})
        choice, spec = got.choices[0], got.model_extra["spec_decode"]
        assert (choice.text, choice.finish_reason) == (want.outputs.text, want.outputs.finish_reason), prompt
        assert got.usage.completion_tokens == len(want.outputs.token_ids)
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
        assert (spec["num_decode_rounds"], spec["num_draft_tokens"], spec["num_accepted_drafts"]) == (
            want.metrics.num_decode_rounds, want.metrics.num_draft_tokens, want.metrics.num_accepted_drafts)
        assert spec["mean_accept_length"] == pytest.approx(want.metrics.mean_accept_length)


def test_streamed_deltas_concatenate_to_in_process_text(case):
    """O1 streamed: the concatenated SSE deltas equal the non-streamed (= in-process) text; the last chunk carries
    the finish reason; include_usage adds the usage chunk."""
    model, workload, expected, client = case
    for (prompt, max_tokens, min_tokens, stop), want in zip(workload, expected):
        chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                                stop=stop, stream=True, stream_options={"include_usage": True},
                                                extra_body={"min_tokens": min_tokens}))
        text_chunks = [c for c in chunks if c.choices]
        assert "".join(c.choices[0].text for c in text_chunks) == want.outputs.text, prompt
        assert text_chunks[-1].choices[0].finish_reason == want.outputs.finish_reason
        assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
        assert chunks[-1].usage.completion_tokens == len(want.outputs.token_ids)
