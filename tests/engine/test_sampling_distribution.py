"""The sampler's distribution (PD_MTP_FLOW §10.2, verify rule in xpu_pre_and_post_process): with fixed logits,
over thousands of seeds, a token outside the top-p nucleus never appears and each token's frequency matches
softmax(logits / T) restricted to the nucleus.

The seeded-equivalence tests compare configurations that share one sampler, so they cannot see a wrong sampler;
these tests compare it with the formula. Statistical bound: for N draws of a token with probability p the count
is Binomial(N, p); a correct sampler lies within 5 standard deviations, sqrt(N p (1 - p)), with probability
above 1 - 6e-7 per token. The seeds are fixed, so the test is deterministic; the bound says why a correct sampler
passes and is tight enough that ignoring the temperature or the nucleus moves some count by tens of deviations.
"""
from __future__ import annotations

import numpy as np
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.schema.step_io import SlotSampling
from fastdeploy.model_executor.xpu_pre_and_post_process import choose_token

N = 4000
LOGITS = np.array([1.0, 3.0, -0.5, 2.5, 0.0, 2.0, -2.0, 1.5])   # distinct, unsorted, no tie


def expected_distribution(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """softmax(logits / T), restricted to the smallest set of most likely tokens whose probability is >= top_p,
    renormalised."""
    probs = np.exp((logits - logits.max()) / temperature)
    probs /= probs.sum()
    order = np.argsort(-probs)
    size = int(np.argmax(np.cumsum(probs[order]) >= top_p)) + 1
    kept = np.zeros_like(probs)
    kept[order[:size]] = probs[order[:size]]
    return kept / kept.sum()


def sample_counts(temperature: float, top_p: float, *, vary: str = "seed") -> np.ndarray:
    """Counts of each token over N draws: seeds 0..N-1 at output index 3, or seed 7 at output indices 0..N-1."""
    counts = np.zeros(len(LOGITS), np.int64)
    for i in range(N):
        seed, out_index = (i, 3) if vary == "seed" else (7, i)
        params = SlotSampling(temperature=temperature, top_p=top_p, seed=seed, min_tokens=0, max_tokens=N + 1,
                              eos_token_ids=(), stop_seqs=())
        counts[choose_token(LOGITS, out_index, params)] += 1
    return counts


def assert_matches(counts: np.ndarray, want: np.ndarray) -> None:
    outside = [t for t in np.flatnonzero(want == 0) if counts[t]]
    assert not outside, f"tokens {outside} outside the nucleus were drawn {counts[outside].tolist()} times"
    mean, sd = N * want, np.sqrt(N * want * (1 - want))
    z = np.abs(counts - mean) / np.where(sd > 0, sd, 1)
    assert z.max() <= 5, f"counts {counts.tolist()} vs expected {np.round(mean, 1).tolist()} (max z {z.max():.1f})"


# (T, top_p, nucleus by hand): sorted probabilities of LOGITS at T = 1 are about .41 .25 .15 .09 ..., so top_p 0.6
# keeps tokens 1 and 3 (.66 >= .6) and 0.3 keeps token 1 alone.
CASES = [(1.0, 1.0, range(8)), (1.0, 0.6, [1, 3]), (0.7, 0.9, [1, 3, 5, 7]), (0.5, 1.0, range(8)),
         (2.0, 0.75, [1, 3, 5, 7]), (1.0, 0.3, [1])]


@pytest.mark.parametrize("temperature, top_p, nucleus", CASES)
def test_sampled_tokens_follow_the_tempered_softmax_restricted_to_the_nucleus(temperature, top_p, nucleus):
    """PD_MTP_FLOW §10.2: over N seeds no token outside the top-p nucleus appears and frequencies match
    softmax(logits / T) on the nucleus within 5 sd. Cases pin the nucleus at 1, 2, 4 and all 8 tokens."""
    want = expected_distribution(LOGITS, temperature, top_p)
    assert np.flatnonzero(want).tolist() == list(nucleus), "the oracle's nucleus differs from the hand-written one"
    assert_matches(sample_counts(temperature, top_p), want)


def test_draws_at_successive_output_indices_follow_the_same_distribution():
    """PD_MTP_FLOW §10.2: the uniform is seeded by (seed, output index), so one request's successive tokens are
    draws from the same distribution too (not one repeated draw)."""
    temperature, top_p = 0.8, 0.85
    want = expected_distribution(LOGITS, temperature, top_p)
    assert np.flatnonzero(want).tolist() == [1, 3, 5]
    assert_matches(sample_counts(temperature, top_p, vary="index"), want)


@pytest.fixture(scope="module")
def toy_llm():
    return LLM(model="fd-toy", max_model_len=128, speculative_config={"method": "mtp", "num_speculative_tokens": 1})


PROMPTS = ["hello world", "the quick brown", "abc", "sampling"]


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1e-6), (1e-3, 1.0)], ids=["tiny_top_p", "tiny_temperature"])
def test_a_one_token_nucleus_or_near_zero_temperature_reproduces_greedy_output(toy_llm, temperature, top_p):
    """PD_MTP_FLOW §10.2 through the whole engine (scheduler → runner → verify, with MTP): a nucleus of one token,
    or a temperature near 0, leaves only the argmax, so every seed gives the greedy output. A layer that drops
    top_p or the temperature samples from the full softmax instead, which on fd-toy differs from greedy for most
    seeds (checked by the control run)."""
    greedy = [o.outputs.token_ids for o in toy_llm.generate(PROMPTS, SamplingParams(max_tokens=12))]
    seeds = range(3)
    params = [SamplingParams(max_tokens=12, temperature=temperature, top_p=top_p, seed=s) for s in seeds
              for _ in PROMPTS]
    sampled = [o.outputs.token_ids for o in toy_llm.generate(PROMPTS * len(seeds), params)]
    assert sampled == greedy * len(seeds)
    control = [SamplingParams(max_tokens=12, temperature=1.0, seed=s) for s in seeds for _ in PROMPTS]
    full = [o.outputs.token_ids for o in toy_llm.generate(PROMPTS * len(seeds), control)]
    assert sum(f != g for f, g in zip(full, greedy * len(seeds))) >= len(full) // 2
