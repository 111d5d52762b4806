"""Logprobs through HTTP (docs/serving.md "Logprobs"; docs/design.md §5, §6): the `openai` client reads completions
`logprobs` (tokens, token_logprobs, top_logprobs, text_offset) and chat `logprobs.content[]` (token, logprob,
bytes, top_logprobs), streamed and not, from one mixed instance and from the built-in router in front of P and D
(fd-tiny, MTP K = 1). A request alone computes every position in the same shapes as the in-process LLM does for
it alone, so the values are the in-process single instance's bit for bit, across the hand-off too. Prefix caching
is off on both sides: a hit (a repeated prompt here) shortens the prefill, and a GEMM row's rounding depends on
the row count under MKL's kernels (benchmarks/cpu_gemm.py marks where), so a hit keeps logprobs only within
tolerance (PD_MTP_FLOW §13.5, checked in tests/e2e/test_prefix_caching.py)."""
from __future__ import annotations

import json

import pytest
from openai import BadRequestError, OpenAI

from fastdeploy import LLM, SamplingParams
from fastdeploy.entrypoints.openai.logprobs import token_bytes, token_text
from fastdeploy.model_executor.models.tokenizer import ByteTokenizer
from tests.services import deployment as deploy
from tests.services import launcher

K = 1
SPEC = {"method": "mtp", "num_speculative_tokens": K}
NO_CACHE = ("--no-enable-prefix-caching",)
TOKENIZER = ByteTokenizer()
COMPLETIONS = [("On Monday, Judy", 12, 3), ("The cat sat", 10, 0)]     # (prompt, max_tokens, logprobs)
CHATS = [("Hi!", 8, 4), ("Tell me", 6, 0)]                               # (user message, max_tokens, top_logprobs)
MODES = ["mixed", "pd"]


def chat_prompt(message: str) -> str:
    return f"<|user|>\n{message}\n<|assistant|>\n"   # the built-in chat template (docs/serving.md)


@pytest.fixture(scope="module", params=MODES)
def served(request):
    """(client, expected outputs by (prompt, max_tokens, N)) for a mixed instance or router + P + D."""
    if request.param == "mixed":
        server = launcher.start("--speculative-config", json.dumps(SPEC), *NO_CACHE, model="fd-tiny",
                                wait_ready=False)
        stop, ready = (lambda: launcher.stop(server)), (lambda: launcher.await_ready(server))
        url = server.openai_base_url
    else:
        pd = deploy.pd_deployment(model="fd-tiny", k=K, prefill_flags=NO_CACHE, decode_flags=NO_CACHE, wait=False)
        stop, ready, url = pd.stop, pd.await_ready, pd.router.openai_base_url
    try:
        llm = LLM(model="fd-tiny", speculative_config=SPEC, enable_prefix_caching=False)   # while the services start
        wanted = [(p, n, lp) for p, n, lp in COMPLETIONS] + [(chat_prompt(m), n, lp) for m, n, lp in CHATS]
        expected = {w: llm.generate([w[0]], SamplingParams(max_tokens=w[1], logprobs=w[2]), use_tqdm=False)[0]
                    for w in wanted}
        ready()
        with OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120) as client:
            yield client, expected
        if request.param == "pd":
            pd.wait_nothing_held()
    finally:
        stop()


def completion_logprobs(out, n: int) -> dict:
    """The completions logprobs object the in-process output must give (docs/serving.md "Logprobs")."""
    entries, texts = out.outputs.logprobs, [token_text(TOKENIZER, t) for t in out.outputs.token_ids]
    tops = []
    for text, e in zip(texts, entries):
        top = {text: e.logprob}
        for t, lp in zip(e.top_token_ids[:n], e.top_logprobs[:n]):
            top.setdefault(token_text(TOKENIZER, t), lp)
        tops.append(top)
    offsets = [len(TOKENIZER.decode(out.outputs.token_ids[:i])) for i in range(len(texts))]   # ASCII outputs
    return {"tokens": texts, "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops,
            "text_offset": offsets}


def chat_logprobs(out) -> list[dict]:
    def entry(t, lp):
        return {"token": token_text(TOKENIZER, t), "logprob": lp, "bytes": token_bytes(TOKENIZER, t)}
    return [{**entry(e.token_id, e.logprob), "top_logprobs": [entry(t, lp) for t, lp in
                                                             zip(e.top_token_ids, e.top_logprobs)]}
            for e in out.outputs.logprobs]


def test_completions_logprobs_equal_the_in_process_values(served):
    """Non-streamed and streamed: one entry per completion token (usage.completion_tokens), `top_logprobs` the
    chosen token and the top N; the streamed chunks' pieces concatenate to the non-streamed object."""
    client, expected = served
    for prompt, max_tokens, n in COMPLETIONS:
        want = expected[(prompt, max_tokens, n)]
        got = client.completions.create(model="fd-tiny", prompt=prompt, max_tokens=max_tokens, logprobs=n)
        assert got.choices[0].text == want.outputs.text
        assert got.choices[0].logprobs.model_dump() == completion_logprobs(want, n), prompt
        assert len(got.choices[0].logprobs.tokens) == got.usage.completion_tokens
        chunks = [c.choices[0] for c in client.completions.create(model="fd-tiny", prompt=prompt, stream=True,
                                                                   max_tokens=max_tokens, logprobs=n) if c.choices]
        merged = {name: [v for c in chunks if c.logprobs for v in getattr(c.logprobs, name)]
                  for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
        assert merged == completion_logprobs(want, n), prompt
        assert "".join(c.text for c in chunks) == want.outputs.text


def test_chat_logprobs_equal_the_in_process_values(served):
    """Chat `logprobs: true` + `top_logprobs`: `content[]` with token, logprob, bytes and exactly top_logprobs
    alternatives, non-streamed and streamed (the role chunk carries none)."""
    client, expected = served
    for message, max_tokens, n in CHATS:
        want = expected[(chat_prompt(message), max_tokens, n)]
        messages = [{"role": "user", "content": message}]
        got = client.chat.completions.create(model="fd-tiny", messages=messages, max_tokens=max_tokens,
                                             logprobs=True, top_logprobs=n)
        assert got.choices[0].message.content == want.outputs.text
        content = [c.model_dump() for c in got.choices[0].logprobs.content]
        assert content == chat_logprobs(want), message
        assert all(len(c["top_logprobs"]) == n for c in content)
        chunks = [c.choices[0] for c in client.chat.completions.create(
            model="fd-tiny", messages=messages, max_tokens=max_tokens, logprobs=True, top_logprobs=n, stream=True)]
        assert chunks[0].delta.role == "assistant" and chunks[0].logprobs is None
        streamed = [e.model_dump() for c in chunks if c.logprobs for e in c.logprobs.content]
        assert streamed == chat_logprobs(want), message
        assert "".join(c.delta.content or "" for c in chunks) == want.outputs.text


def test_logprob_fields_out_of_range_are_refused_by_name(served):
    client, _ = served
    chat = dict(model="fd-tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    for call, fields, param in [(client.completions.create, {"prompt": "Hi", "logprobs": 6}, "logprobs"),
                                (client.completions.create, {"prompt": "Hi", "extra_body": {"top_logprobs": 2}},
                                 "top_logprobs"),
                                (client.chat.completions.create, {**chat, "logprobs": True, "top_logprobs": 21},
                                 "top_logprobs"),
                                (client.chat.completions.create, {**chat, "top_logprobs": 2}, "top_logprobs")]:
        with pytest.raises(BadRequestError) as refused:
            call(**({"model": "fd-tiny", "max_tokens": 2} | fields))
        assert refused.value.body["param"] == param, fields
