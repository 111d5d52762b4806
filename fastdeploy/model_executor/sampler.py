"""The target's token at one output position, from its logits and the request's sampling controls.

docs/serving.md ("Sampling controls") states the semantics and their public sources; in short, in this order:

1. EOS ids are masked while the output is shorter than min_tokens.
2. Penalties (vLLM's `apply_penalties`, FastDeploy's `apply_penalty_multi_scores`), over the tokens of the context
   the position is sampled in: for a token seen in the prompt or the outputs so far, repetition_penalty divides a
   positive logit and multiplies a negative one; frequency_penalty x (its count in the outputs) and
   presence_penalty x (1 if it is in the outputs) are subtracted.
3. temperature 0: the argmax. Otherwise softmax(logits / temperature), then min_p (tokens below min_p x the most
   likely token's probability dropped), then top_k (the k most likely, ties to the lower id), then top_p (the
   smallest prefix of the rest, by probability, whose mass reaches top_p of the rest's mass) — vLLM v1's and
   FastDeploy's order — and one draw by inverse CDF with a uniform from a generator seeded by (seed, output index).

Penalties are applied over a batch of rows at once (`penalize`): each row carries its own context, so MTP verify
gives the row of verified position a the outputs before the step plus the drafts accepted before it, exactly the
context the K = 0 engine samples that position in (the row is only used when those drafts were accepted).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from fastdeploy.schema.step_io import SlotSampling

# Observes the distribution each emitted position is drawn from: (slot, the slot's controls, output index,
# probabilities [V] float64 summing to 1, zero outside the kept tokens; one-hot at the argmax for temperature 0).
DistributionHook = Callable[[int, SlotSampling, int, np.ndarray], None]


def penalize(logits: np.ndarray, sampling: list[SlotSampling], outputs: list[np.ndarray]) -> np.ndarray:
    """logits [R, V] -> float64 [R, V] with each row's penalties applied: row r's request is sampling[r] and its
    outputs so far (the tokens generated before the row's position, in order) are outputs[r]."""
    rows, vocab = logits.shape
    x = logits.astype(np.float64, copy=True)
    if rows == 0:
        return x
    counts = np.zeros((rows, vocab), np.int64)
    out_rows = np.repeat(np.arange(rows), [len(o) for o in outputs])
    np.add.at(counts, (out_rows, np.concatenate(outputs).astype(np.int64)), 1)
    in_prompt = np.zeros((rows, vocab), bool)
    prompts = [np.asarray(s.prompt_token_ids, np.int64) for s in sampling]
    in_prompt[np.repeat(np.arange(rows), [len(p) for p in prompts]), np.concatenate(prompts)] = True
    repetition = np.array([s.repetition_penalty for s in sampling])[:, None]
    frequency = np.array([s.frequency_penalty for s in sampling])[:, None]
    presence = np.array([s.presence_penalty for s in sampling])[:, None]
    in_output = counts > 0
    with np.errstate(invalid="ignore"):   # -inf (a masked EOS) stays -inf under either scaling
        scaled = np.where(x > 0, x / repetition, x * repetition)
    x = np.where(in_prompt | in_output, scaled, x)
    return x - frequency * counts - presence * in_output


def choose_token(logits: np.ndarray, out_index: int, sampling: SlotSampling,
                 record: Callable[[np.ndarray], None] | None = None) -> int:
    """The target's token at output index `out_index` from logits [V] (already penalized; rule in the module
    docstring). `record`, if given, receives the distribution the token is drawn from (DistributionHook's form)."""
    if out_index + 1 < sampling.min_tokens:
        logits = logits.astype(np.float64, copy=True)
        logits[list(sampling.eos_token_ids)] = -np.inf
    if sampling.temperature == 0.0:
        token = int(np.argmax(logits))
        if record is not None:
            record(np.eye(1, logits.shape[-1], token, dtype=np.float64)[0])
        return token
    # Shift before scaling: (logit - max) <= 0, so dividing by any temperature > 0, however small, gives a value
    # in [-inf, 0] (overflow to -inf is the intended limit) and exp() a value in [0, 1] with exp(0) = 1 at the
    # argmax; never inf - inf = NaN.
    logits = logits.astype(np.float64)
    with np.errstate(over="ignore"):
        probs = np.exp((logits - logits.max()) / sampling.temperature)
    if sampling.min_p > 0.0:
        # probs / max(probs) = probs here (the argmax's is exp(0) = 1): min_p compares with it directly
        probs = np.where(probs < sampling.min_p, 0.0, probs)
    order = np.argsort(-probs, kind="stable")
    sorted_probs = probs[order] / probs.sum()
    if sampling.top_k > 0 or sampling.min_p > 0.0:
        limit = int(np.count_nonzero(sorted_probs))
        sorted_probs = sorted_probs[:min(limit, sampling.top_k or limit)]
    cumulative = np.cumsum(sorted_probs)
    keep = int(np.searchsorted(cumulative, sampling.top_p * cumulative[-1])) + 1
    nucleus = np.cumsum(sorted_probs[:keep])
    if record is not None:
        dist = np.zeros(probs.shape, np.float64)
        dist[order[:keep]] = sorted_probs[:keep] / nucleus[-1]
        record(dist)
    u = np.random.default_rng([sampling.seed, out_index]).random() * nucleus[-1]
    return int(order[min(int(np.searchsorted(nucleus, u, side="right")), keep - 1)])


class SlotControls:
    """What verify's array path reads of each slot's sampling controls, as arrays over the slots, written when a
    request is inserted (`set`) so a step reads them without a walk over its requests: whether the slot's rounds
    are plain greedy (temperature 0, no penalty), its min_tokens, whether it asked for logprobs, and which set of
    EOS ids it stops at (an index into `eos_sets`; requests mostly share the model's)."""

    def __init__(self, num_slots: int):
        self.plain_greedy = np.zeros(num_slots, bool)
        self.min_tokens = np.zeros(num_slots, np.int64)
        self.eos_set = np.zeros(num_slots, np.int64)
        self.logprobs = np.zeros(num_slots, bool)   # the request asked for logprobs
        self.eos_sets: list[tuple[int, ...]] = []
        self._eos_index: dict[tuple[int, ...], int] = {}

    @classmethod
    def of(cls, sampling: list[SlotSampling | None]) -> SlotControls:
        """The controls of a whole list of slots (None: an empty slot)."""
        controls = cls(len(sampling))
        for slot, params in enumerate(sampling):
            if params is not None:
                controls.set(slot, params)
        return controls

    def set(self, slot: int, sampling: SlotSampling) -> None:
        self.plain_greedy[slot] = sampling.temperature == 0.0 and not sampling.uses_penalties
        self.min_tokens[slot] = sampling.min_tokens
        self.logprobs[slot] = sampling.logprobs is not None
        eos = tuple(sampling.eos_token_ids)
        if eos not in self._eos_index:
            self._eos_index[eos] = len(self.eos_sets)
            self.eos_sets.append(eos)
        self.eos_set[slot] = self._eos_index[eos]
