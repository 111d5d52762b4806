"""A user's remedy for a looping small model (docs/serving.md, "Sampling controls"): fd-tiny's greedy answer to
"On Monday" repeats one sentence; repetition_penalty 1.5 breaks the loop, and MTP (K = 1) emits the same tokens."""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams

PROMPT = "On Monday"


def repeated_4grams(ids: list[int]) -> int:
    grams = [tuple(ids[i:i + 4]) for i in range(len(ids) - 3)]
    return len(grams) - len(set(grams))


@pytest.fixture(scope="module")
def llm():
    return LLM(model="fd-tiny")


def test_repetition_penalty_breaks_a_greedy_loop(llm):
    plain = SamplingParams(max_tokens=64, ignore_eos=True)
    (looping,) = llm.generate(PROMPT, plain, use_tqdm=False)
    assert repeated_4grams(looping.outputs.token_ids) >= 10, looping.outputs.text
    penalized = SamplingParams(max_tokens=64, ignore_eos=True, repetition_penalty=1.5)
    (broken,) = llm.generate(PROMPT, penalized, use_tqdm=False)
    assert repeated_4grams(broken.outputs.token_ids) <= 2, broken.outputs.text
    mtp = LLM(model="fd-tiny", speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    (speculated,) = mtp.generate(PROMPT, penalized, use_tqdm=False)
    assert speculated.outputs.token_ids == broken.outputs.token_ids
