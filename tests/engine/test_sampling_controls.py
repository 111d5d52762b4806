"""The sampling controls of docs/serving.md ("Sampling controls"), unit by unit: penalties against a per-token
NumPy reference and transformers' RepetitionPenaltyLogitsProcessor, min_p / top_k / top_p against transformers'
warpers, the MTP verify context (drafts accepted before a row count for it), and SamplingParams' ranges."""
from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.model_executor.sampler import choose_token, penalize
from fastdeploy.model_executor.step_state import ShareInputs
from fastdeploy.model_executor.xpu_pre_and_post_process import pre_process, verify
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.schema.step_io import SlotSampling

from .helpers import EOS

V = 12


def slot(**controls) -> SlotSampling:
    return SlotSampling(**{"temperature": 0.0, "top_p": 1.0, "seed": 0, "min_tokens": 0, "max_tokens": 64,
                           "eos_token_ids": (EOS,), "stop_seqs": (), **controls})


def reference_penalties(logits, prompt, outputs, repetition, frequency, presence) -> np.ndarray:
    """vLLM's documented formulas, one token at a time."""
    out = logits.astype(np.float64).copy()
    for token in range(len(out)):
        count = list(outputs).count(token)
        if token in prompt or count:
            out[token] = out[token] / repetition if out[token] > 0 else out[token] * repetition
        out[token] -= frequency * count + presence * (count > 0)
    return out


def test_penalties_equal_the_reference_row_by_row():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(4, V)).astype(np.float32)
    cases = [((1, 2), [3, 3, 4], 1.3, 0.5, 0.2), ((), [0, 0, 0, 7], 0.8, -0.4, 1.0), ((5, 6, 5), [], 2.0, 1.0, 1.0),
             ((9,), [9, 10, 11, 10], 1.0, 0.0, -2.0)]
    params = [slot(prompt_token_ids=p, repetition_penalty=r, frequency_penalty=f, presence_penalty=s)
              for p, _, r, f, s in cases]
    got = penalize(logits, params, [np.array(o, np.int64) for _, o, *_ in cases])
    for row, (prompt, outputs, r, f, s) in enumerate(cases):
        np.testing.assert_allclose(got[row], reference_penalties(logits[row], prompt, outputs, r, f, s), atol=1e-6)


def test_repetition_penalty_equals_transformers_processor():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(1, V)).astype(np.float32)
    prompt, outputs = (1, 4, 4), np.array([7, 1, 9], np.int64)
    theirs = transformers.RepetitionPenaltyLogitsProcessor(1.7)(
        torch.tensor([list(prompt) + outputs.tolist()]), torch.tensor(logits))
    ours = penalize(logits, [slot(prompt_token_ids=prompt, repetition_penalty=1.7)], [outputs])
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-6)


def expected_distribution(logits, temperature, min_p, top_k, top_p) -> np.ndarray:
    """transformers' warpers in this project's order (temperature, min_p, top_k, top_p), then softmax."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    scores = torch.tensor(logits[None], dtype=torch.float64)
    warpers = [transformers.TemperatureLogitsWarper(temperature)]
    if min_p > 0:
        warpers.append(transformers.MinPLogitsWarper(min_p))
    if top_k > 0:
        warpers.append(transformers.TopKLogitsWarper(top_k))
    warpers.append(transformers.TopPLogitsWarper(top_p))
    for warper in warpers:
        scores = warper(None, scores)
    return torch.softmax(scores, dim=-1)[0].numpy()


@pytest.mark.parametrize("temperature,min_p,top_k,top_p", [(1.0, 0.0, 3, 1.0), (1.0, 0.2, 0, 1.0),
                                                           (0.8, 0.1, 4, 0.8), (1.5, 0.0, 5, 0.7),
                                                           (1.0, 0.5, 2, 1.0)])
def test_sampled_frequencies_follow_min_p_top_k_top_p(temperature, min_p, top_k, top_p):
    """Over 3000 seeds no token outside the kept set is drawn and each kept token's frequency is within 5
    standard deviations of the transformers warpers' probability (the seeds are fixed: deterministic)."""
    logits = np.array([1.0, 3.0, -0.5, 2.5, 0.0, 2.0, -2.0, 1.5, 0.7, -1.0, 2.2, 0.3])
    want = expected_distribution(logits, temperature, min_p, top_k, top_p)
    n = 3000
    counts = np.zeros(V, np.int64)
    for seed in range(n):
        params = slot(temperature=temperature, min_p=min_p, top_k=top_k, top_p=top_p, seed=seed)
        counts[choose_token(logits, 2, params)] += 1
    assert not counts[want == 0].any(), f"drawn outside the kept set: {counts.tolist()} vs {want.round(3)}"
    sd = np.sqrt(n * want * (1 - want))
    assert (np.abs(counts - n * want) <= 5 * np.where(sd > 0, sd, 1)).all(), (counts.tolist(), (n * want).round(1))


def test_greedy_takes_the_argmax_of_the_penalized_logits():
    logits = np.zeros(V)
    logits[[3, 4]] = [2.0, 1.8]
    rows = penalize(logits[None], [slot(prompt_token_ids=(3,), repetition_penalty=1.2)], [np.zeros(0, np.int64)])
    assert choose_token(rows[0], 0, slot(top_k=1)) == 4


def _decode_round(drafts, targets, outputs_before, **controls):
    """One decode round of slot 0 (drafts[0] the last accepted token); targets[i] = {token: logit} of row i."""
    state = ShareInputs.allocate(2, 2, 32, 8, 1, 2, (EOS,))
    state.stop_flags[0] = False
    state.seq_lens_this_time[0], state.seq_lens_decoder[0] = len(drafts), 6
    state.draft_tokens[0, :len(drafts)] = drafts
    state.step_idx[0], state.max_dec_len[0] = len(outputs_before), 20
    state.pre_ids[0, 1:1 + len(outputs_before)] = outputs_before
    state.block_tables[0, :4] = [0, 1, 2, 3]
    logits = np.zeros((len(targets), 260))
    for row, values in enumerate(targets):
        for token, value in values.items():
            logits[row, token] = value
    verify(state, pre_process(state), logits, [slot(**controls), None])
    return tuple(state.accept_tokens[0, :state.accept_num[0]])


def test_mtp_row_counts_the_drafts_accepted_before_it():
    """The K = 0 engine samples position 1 after emitting draft 11: its presence penalty moves the argmax to 12,
    which accepts draft 12; position 2 sees 11 and 12 and picks 13. Rows that ignored the accepted drafts would
    pick 11 at position 1 and reject draft 12."""
    targets = [{11: 2.0, 1: 1.0}, {11: 2.0, 12: 1.9}, {12: 2.0, 13: 1.8}]
    assert _decode_round((10, 11, 12), targets, [5, 10], presence_penalty=0.5) == (11, 12, 13)
    assert _decode_round((10, 11, 12), targets, [5, 10]) == (11, 11)


def test_repetition_penalty_counts_the_prompt_and_the_earlier_outputs():
    targets = [{7: 2.0, 8: 1.9, 9: 1.35}]   # 7 -> 1.33 (prompt); 8 -> 1.27 once emitted
    assert _decode_round((10,), targets, [5, 10], repetition_penalty=1.5, prompt_token_ids=(7,)) == (8,)
    assert _decode_round((10,), targets, [5, 8], repetition_penalty=1.5, prompt_token_ids=(7,)) == (9,)


@pytest.mark.parametrize("field,value", [("top_k", -2), ("top_k", 1.5), ("min_p", 1.5), ("min_p", -0.1),
                                         ("repetition_penalty", 0.0), ("repetition_penalty", float("inf")),
                                         ("frequency_penalty", 2.5), ("presence_penalty", -3.0)])
def test_out_of_range_controls_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"field '{field}'"):
        SamplingParams(**{field: value})


def test_top_k_minus_one_means_every_token_and_neutral_values_use_no_penalty():
    assert SamplingParams(top_k=-1).top_k == 0
    assert not SamplingParams().uses_penalties and SamplingParams(presence_penalty=0.1).uses_penalties
