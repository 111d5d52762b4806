"""Sampling is numerically safe for every accepted temperature (xpu_pre_and_post_process.choose_token): a
temperature so small that logits / temperature overflows to inf (1e-310, the smallest subnormal) samples the
argmax, never NaN probabilities (which used to pick token 0, a NUL byte, at every position)."""
from __future__ import annotations

import numpy as np
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.schema.step_io import SlotSampling
from fastdeploy.model_executor.xpu_pre_and_post_process import choose_token

V = 259
TINY = [1e-310, 5e-324, 1e-300, 1e-200, 1e-12]


def _sampling(temperature: float, seed: int, top_p: float = 1.0) -> SlotSampling:
    return SlotSampling(temperature=temperature, top_p=top_p, seed=seed, min_tokens=0, max_tokens=100,
                        eos_token_ids=(257,), stop_seqs=())


def _logits(seed: int) -> np.ndarray:
    """Random logits [V] with one clear argmax (not token 0) and large magnitudes."""
    logits = np.random.default_rng(seed).normal(0.0, 50.0, V)
    logits[97] = logits.max() + 1.0
    return logits.astype(np.float32)


@pytest.mark.parametrize("temperature", TINY)
@pytest.mark.parametrize("top_p", [1.0, 0.5])
def test_tiny_temperature_samples_the_argmax(temperature, top_p):
    for seed in range(20):
        assert choose_token(_logits(seed), seed, _sampling(temperature, seed, top_p)) == 97


def test_tiny_temperature_with_tied_maxima_picks_one_of_them():
    logits = np.zeros(V, np.float32)
    logits[[5, 200]] = 3.0
    picks = {choose_token(logits, i, _sampling(1e-310, i)) for i in range(40)}
    assert picks <= {5, 200} and len(picks) == 2


def test_huge_temperature_is_finite_and_in_vocabulary():
    for seed in range(10):
        assert 0 <= choose_token(_logits(seed), seed, _sampling(1e308, seed)) < V


def test_offline_llm_at_a_subnormal_temperature_gives_the_greedy_text():
    """The whole engine at temperature 1e-310: the greedy output, no NUL bytes."""
    llm = LLM(model="fd-toy")
    greedy = llm.generate("Hello", SamplingParams(max_tokens=12), use_tqdm=False)[0].outputs
    tiny = llm.generate("Hello", SamplingParams(max_tokens=12, temperature=1e-310, seed=3),
                        use_tqdm=False)[0].outputs
    assert tiny.token_ids == greedy.token_ids and "\x00" not in tiny.text
