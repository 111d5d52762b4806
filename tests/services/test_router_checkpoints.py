"""A user's checkpoint through the router (every path unchanged in what it promises): tiny random
ERNIE-4.5 and Qwen3 checkpoints written by the test, with their trained tokenizers and chat templates, served
as PD over ZeroMQ, PD over Mooncake and 1P2D, with prefix caching on and off. Through the `openai` client each
gives the in-process single instance's greedy text and logprobs; a chat rendered with the checkpoint's template
streams the text it answers non-streamed (SERVICES §8 "O1/O2 through services")."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.entrypoints.chat_template import chat_prompt_ids, chat_template_for
from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from tests.checkpoint_files import write_numpy_checkpoint
from tests.services import deployment as deploy

PROMPTS = ["On Monday, Judy", "你好，你是谁？", "The cat sat on the mat and then", "a b c d e f g h i j k l m n o p"]
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "你好，你是谁？"}]
MAX_TOKENS = 24
MOONCAKE = ("--cache-transfer-protocol", "mooncake-tcp")
NO_PREFIX = ("--no-enable-prefix-caching",)


@dataclass(frozen=True)
class Case:
    name: str
    architecture: str
    mode: str                      # "pd", "pd-mooncake", "1p2d"
    flags: tuple[str, ...] = ()    # for every instance


CASES = [Case("ernie-pd-zmq", "Ernie4_5ForCausalLM", "pd"),
         Case("ernie-pd-zmq-no-prefix-cache", "Ernie4_5ForCausalLM", "pd", NO_PREFIX),
         Case("qwen3-pd-mooncake", "Qwen3ForCausalLM", "pd-mooncake"),
         Case("ernie-1p2d", "Ernie4_5ForCausalLM", "1p2d")]


def _deployment(case: Case, model: str) -> deploy.Deployment:
    if case.mode == "pd":
        return deploy.pd_deployment(model=model, prefill_flags=case.flags, decode_flags=case.flags, wait=False)
    if case.mode == "pd-mooncake":
        reason = mooncake_unavailable_reason()
        if reason is not None:
            pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
        flags = (*MOONCAKE, *case.flags)
        return deploy.pd_deployment(model=model, prefill_flags=flags, decode_flags=flags, wait=False)
    return deploy.fleet_deployment(model=model, num_prefill=1, num_decode=2, flags=case.flags, wait=False)


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def served(request, tmp_path_factory):
    case = request.param
    checkpoint = write_numpy_checkpoint(tmp_path_factory.mktemp("ckpt") / f"tiny-{case.name}",
                                        architecture=case.architecture, seed=7, tokenizer=True)
    model = str(checkpoint)
    deployment = _deployment(case, model)
    try:
        llm = LLM(model=model, enable_prefix_caching=NO_PREFIX[0] not in case.flags)   # while the services start
        template = chat_template_for(llm.tokenizer)
        chat_ids = chat_prompt_ids(llm.tokenizer, template.render(MESSAGES, add_generation_prompt=True))
        params = SamplingParams(max_tokens=MAX_TOKENS, logprobs=2)
        expected = llm.generate([*PROMPTS, chat_ids], [params] * (len(PROMPTS) + 1), use_tqdm=False)
        deployment.await_ready()
        with deployment.client() as client:
            yield checkpoint.name, expected, client
        deployment.wait_nothing_held()
    finally:
        deployment.stop()


def test_completions_through_the_router_equal_the_in_process_instance(served):
    """Greedy text, finish reason, token count and the chosen tokens' logprobs equal LLM(model=PATH)'s, prompt by
    prompt, twice (the second pass hits the prefix cache where it is on: the same answers)."""
    name, expected, client = served
    for _ in range(2):
        for prompt, want in zip(PROMPTS, expected):
            got = client.completions.create(model=name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                            logprobs=2)
            choice = got.choices[0]
            assert (choice.text, choice.finish_reason) == (want.outputs.text, want.outputs.finish_reason), prompt
            assert got.usage.completion_tokens == len(want.outputs.token_ids), prompt
            wanted = [entry.logprob for entry in want.outputs.logprobs]
            assert choice.logprobs.token_logprobs == pytest.approx(wanted, abs=1e-4), prompt


def test_chat_streams_the_text_it_answers_through_the_router(served):
    """The checkpoint's chat template renders the prompt; the streamed deltas concatenate to the non-streamed
    answer, and both equal the in-process instance's text for the same prompt ids."""
    name, expected, client = served
    want = expected[-1].outputs
    whole = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    chunks = list(client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                 temperature=0, stream=True))
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert whole.choices[0].message.content == want.text
    assert streamed == want.text
    assert whole.usage.prompt_tokens == len(expected[-1].prompt_token_ids)
