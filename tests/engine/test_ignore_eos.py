"""`SamplingParams(ignore_eos=True)` (SGLang's and vLLM's `ignore_eos`): the model's EOS ids do not end the request,
so it runs to `max_tokens` with EOS ids in its output; `stop_token_ids` still end it. The same tokens single and PD,
with and without MTP (P must not take an EOS t0 for a terminating one), and nothing held afterwards."""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.models import get_model

TOY = get_model("fd-toy")
EOS = TOY.eos_token_ids[0]
# greedy outputs whose EOS comes as t0 (P's own token), in D's first round, and inside a later run
PROMPTS = [TOY.find_prompt(0, 9, seed=1), TOY.find_prompt(1, 9, seed=11), TOY.find_prompt(5, 9, seed=21)]
MAX_TOKENS = 12
CONFIGS = [("single", 0), ("single", 1), ("pd", 0), ("pd", 2)]


def _llm(mode: str, k: int) -> LLM:
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    return LLM(model="fd-toy", speculative_config=spec, splitwise=mode == "pd")


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """The single instance without speculation: the tokens every configuration must emit."""
    outputs = _llm("single", 0).generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
                                         use_tqdm=False)
    return [list(o.outputs.token_ids) for o in outputs]


@pytest.mark.parametrize("mode,k", CONFIGS, ids=[f"{m}-k{k}" for m, k in CONFIGS])
def test_ignore_eos_runs_to_max_tokens_through_eos(mode, k, reference):
    llm = _llm(mode, k)
    plain = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS), use_tqdm=False)
    assert [len(o.outputs.token_ids) for o in plain] == [1, 2, 6]       # the prompts end at EOS without it
    assert all(o.outputs.finish_reason == "stop" for o in plain)
    ignoring = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
    for out, want, before in zip(ignoring, reference, plain):
        tokens = list(out.outputs.token_ids)
        assert out.outputs.finish_reason == "length" and tokens == want
        assert tokens[:len(before.outputs.token_ids)] == list(before.outputs.token_ids)   # EOS kept in place
        assert EOS in tokens
    stats = llm.resource_stats()
    for half in (stats.values() if isinstance(stats, dict) else [stats]):
        assert (half.free_slots, half.free_kv_blocks, half.running_requests) == \
            (half.total_slots, half.total_kv_blocks, 0)


def test_stop_token_ids_still_end_an_ignore_eos_request(reference):
    """The request's own stop ids stay stop tokens; here the first token after the first EOS of prompt 0."""
    after_eos = reference[0][reference[0].index(EOS) + 1]
    (out,) = _llm("pd", 1).generate(PROMPTS[:1], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True,
                                                                stop_token_ids=[after_eos]), use_tqdm=False)
    want = reference[0][:reference[0].index(after_eos) + 1]
    assert list(out.outputs.token_ids) == want and out.outputs.finish_reason == "stop"


def test_ignore_eos_with_stop_strings_is_refused_naming_the_field():
    """A matched stop string ends a request through the model's EOS id, which ignore_eos turns off."""
    with pytest.raises(ValueError, match="'ignore_eos'.*'stop'"):
        SamplingParams(ignore_eos=True, stop=["x"])
    with pytest.raises(ValueError, match="'ignore_eos'"):
        SamplingParams(ignore_eos=1)
