"""Verify (OPS §4 stage 6, PD_MTP_FLOW §10.2) in xpu_pre_and_post_process: lossless greedy acceptance,
per-position EOS suppression, the max_dec_len cap, and the seeded temperature rule."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.schema.step_io import SlotSampling
from fastdeploy.model_executor.xpu_pre_and_post_process import choose_token, pre_process, verify
from fastdeploy.model_executor.step_state import ShareInputs

from .helpers import EOS

V = 260


def sampling(min_tokens=0, max_tokens=10, temperature=0.0, seed=0) -> SlotSampling:
    return SlotSampling(temperature=temperature, top_p=1.0, seed=seed, min_tokens=min_tokens,
                        max_tokens=max_tokens, eos_token_ids=(EOS,), stop_seqs=())


def logits_for(rows: list[tuple[int, int]]) -> np.ndarray:
    """[N, V]: row i has its argmax at rows[i][0] and its second choice at rows[i][1]."""
    out = np.zeros((len(rows), V))
    for i, (top, second) in enumerate(rows):
        out[i, top], out[i, second] = 2.0, 1.0
    return out


@dataclass(frozen=True)
class DecodeCase:
    name: str
    drafts: tuple[int, ...]        # draft_tokens[b, 0:stlt]: last accepted token, then the drafts
    targets: tuple[tuple[int, int], ...]  # (argmax, second) of the target at each input position
    step_idx: int
    min_tokens: int
    max_tokens: int
    accepted: tuple[int, ...]
    stopped: bool


CASES = [
    DecodeCase("all_drafts_accepted_plus_bonus", (10, 11, 12), ((11, 1), (12, 1), (13, 1)), 2, 0, 10,
               (11, 12, 13), False),
    DecodeCase("first_draft_rejected_gives_correction", (10, 11, 12), ((20, 1), (12, 1), (13, 1)), 2, 0, 10,
               (20,), False),
    DecodeCase("second_draft_rejected", (10, 11, 12), ((11, 1), (21, 1), (13, 1)), 2, 0, 10, (11, 21), False),
    DecodeCase("eos_inside_accepted_run_stops_there", (10, EOS, 12), ((EOS, 1), (12, 1), (13, 1)), 2, 0, 10,
               (EOS,), True),
    DecodeCase("eos_as_bonus_token", (10, 11, 12), ((11, 1), (12, 1), (EOS, 1)), 2, 0, 10, (11, 12, EOS), True),
    DecodeCase("eos_suppressed_before_min_tokens", (10, 11, 12), ((EOS, 30), (12, 1), (13, 1)), 2, 4, 10,
               (30,), False),
    DecodeCase("eos_allowed_at_min_tokens", (10, 11, 12), ((11, 1), (EOS, 31), (13, 1)), 2, 4, 10,
               (11, EOS), True),
    DecodeCase("max_tokens_caps_the_run", (10, 11, 12), ((11, 1), (12, 1), (13, 1)), 8, 0, 10, (11, 12), True),
]


def decode_state(case: DecodeCase) -> ShareInputs:
    state = ShareInputs.allocate(2, 2, 32, 8, 1, 2, (EOS,))
    b, stlt = 0, len(case.drafts)
    state.stop_flags[b] = False
    state.seq_lens_this_time[b], state.seq_lens_decoder[b] = stlt, 6
    state.draft_tokens[b, :stlt] = case.drafts
    state.step_idx[b], state.max_dec_len[b] = case.step_idx, case.max_tokens
    state.block_tables[b, :4] = [0, 1, 2, 3]
    return state


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_decode_round_verification(case):
    """Each case states drafts, target choices and the expected accepted run (OPS §4 stage 6)."""
    state = decode_state(case)
    packed = pre_process(state)
    counts = verify(state, packed, logits_for(list(case.targets)),
                    [sampling(case.min_tokens, case.max_tokens), None])
    n = len(case.accepted)
    assert state.accept_num[0] == n and tuple(state.accept_tokens[0, :n]) == case.accepted
    assert state.step_idx[0] == case.step_idx + n and bool(state.stop_flags[0]) == case.stopped
    assert counts.tolist() == [len(case.drafts) - 1, -1]


def test_slots_stopped_at_entry_are_not_written():
    """Stage 6 "writes nothing for slots already stopped at entry"."""
    state = decode_state(CASES[0])
    state.stop_flags[0] = True
    before = {k: getattr(state, k).copy() for k in ("accept_tokens", "accept_num", "step_idx", "stop_flags")}
    verify(state, pre_process(state), np.zeros((0, V)), [sampling(), None])
    for name, value in before.items():
        np.testing.assert_array_equal(getattr(state, name), value, err_msg=name)


def test_intermediate_prefill_chunk_produces_nothing():
    """A chunk that leaves known tokens uncomputed yields accept_num 0 (PD_MTP_FLOW §4.1) and keeps step_idx."""
    state = ShareInputs.allocate(1, 1, 32, 8, 1, 2, (EOS,))
    state.stop_flags[0] = False
    state.seq_lens_this_time[0] = state.seq_lens_encoder[0] = 4
    state.prompt_lens[0] = 10
    state.block_tables[0, :3] = [0, 1, 2]
    packed = pre_process(state)
    verify(state, packed, logits_for([(5, 1)] * 4), [sampling()])
    assert state.accept_num[0] == 0 and state.step_idx[0] == 0 and not state.stop_flags[0]


def test_sampled_token_depends_only_on_seed_and_output_index():
    """Temperature rule: the same (seed, index) on the same logits gives the same token, in any batch."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=V)
    params = sampling(temperature=0.9, seed=42)
    draws = [choose_token(logits, i, params) for i in range(40)]
    assert draws == [choose_token(logits.copy(), i, params) for i in range(40)]
    assert len(set(draws)) > 5


def test_sampled_outputs_are_identical_with_and_without_speculation():
    """With temperature > 0 and a seed, MTP K = 2 emits exactly what no speculation emits (the draft is accepted
    iff it equals the seeded sample), so the output distribution is the target's."""
    from fastdeploy.entrypoints.llm import LLM
    params = [SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, seed=s) for s in range(6)]
    prompts = [[256, 72 + s, 105] for s in range(6)]
    outputs = {}
    for k in (0, 2):
        llm = LLM(model="fd-toy", speculative_config={"method": "mtp", "num_speculative_tokens": k} if k else None,
                  max_num_seqs=4, block_size=4, max_model_len=64)
        outputs[k] = [o.outputs.token_ids for o in llm.generate(prompts, params)]
    assert outputs[0] == outputs[2]
    greedy = LLM(model="fd-toy", max_num_seqs=4, block_size=4, max_model_len=64).generate(
        prompts, SamplingParams(max_tokens=20))
    assert outputs[0] != [o.outputs.token_ids for o in greedy]
