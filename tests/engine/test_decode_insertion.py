"""D-side first-round insertion (PD_MTP_FLOW §5.3-§5.6, invariant I3) at runner level: a slot inserted on a
decode-role runner from P's state continues exactly like a single instance after its prompt completed."""
from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.config import CacheConfig, FDConfig, SchedulerConfig, SpeculativeConfig
from fastdeploy.schema.step_io import DecodeTask, PrefillTask, SlotSampling, StepPlan
from fastdeploy.model_executor.models import get_model
from fastdeploy.model_executor.ops import step_message
from fastdeploy.worker.kv_transfer import PromptKVPort
from fastdeploy.worker.xpu_model_runner import XPUModelRunner

K = 2
SAMPLING = SlotSampling(temperature=0.0, top_p=1.0, seed=0, min_tokens=0, max_tokens=40, eos_token_ids=(257,),
                        stop_seqs=())
# Fields of PD_MTP_FLOW §5.6 that must be equal between D after insertion and the single instance after its prompt step
EQUAL_FIELDS = ("stop_flags", "seq_lens_encoder", "seq_lens_decoder", "seq_lens_this_time", "step_idx",
                "actual_draft_token_nums", "mask_rollback", "is_block_step", "min_dec_len", "max_dec_len")


def make_runner(role: str) -> XPUModelRunner:
    config = FDConfig(model="fd-toy", role=role, speculative=SpeculativeConfig("mtp", K),
                      cache=CacheConfig(block_size=4, num_kv_blocks=32),
                      scheduler=SchedulerConfig(max_num_seqs=2, max_model_len=64))
    return XPUModelRunner(config, get_model("fd-toy", mtp_agreement=0.5))


@pytest.fixture
def prompt():
    return get_model("fd-toy").find_prompt(eos_index=9, prompt_len=11, seed=3)


def entries(runner, plan):
    decoded = step_message.decode_step_message(runner.execute_model(plan).message)
    return decoded[1][0] if decoded else None


def test_first_round_on_decode_runner_matches_single_instance(prompt):
    """I3 and O2 at runner level: after D's insertion the PD_MTP_FLOW §5.6 fields equal the single instance's, and every
    following round reports the same tokens and writes the same drafts."""
    L, blocks = len(prompt), tuple(range(8))
    single, decode = make_runner("mixed"), make_runner("decode")
    first = entries(single, StepPlan(0, prefill_tasks=[PrefillTask(0, 0, L, L, tuple(prompt), (), blocks,
                                                                   SAMPLING)]))
    t0, d1 = first[0], int(single.state.draft_tokens[0, 1])
    assert first == [t0] and single.state.seq_lens_this_time[0] == 2   # exactly one draft (PD_MTP_FLOW §5.4 MTP rule)
    PromptKVPort(decode.kv, decode.model.num_target_layers).write_prompt_kv(   # P's target + MTP KV
        blocks, *PromptKVPort(single.kv, single.model.num_target_layers).read_prompt_kv(blocks, L))
    decode.insert_tasks(StepPlan(0, decode_tasks=[DecodeTask(0, L, (t0, d1), blocks, SAMPLING)]))
    for name in EQUAL_FIELDS:
        assert getattr(decode.state, name)[0] == getattr(single.state, name)[0], name
    assert decode.state.prompt_lens[0] == L + 1 and single.state.prompt_lens[0] == L
    np.testing.assert_array_equal(decode.state.draft_tokens[0, :2], [t0, d1])
    assert decode.state.pre_ids[0, 1] == t0 == single.state.pre_ids[0, 1]
    for name in ("seq_lens_encoder", "seq_lens_decoder"):
        assert getattr(decode.proposer, name)[0] == getattr(single.proposer, name)[0], f"proposer {name}"
    for step in range(1, 12):
        got, want = entries(decode, StepPlan(step)), entries(single, StepPlan(step))
        assert got == want, f"round {step}"
        np.testing.assert_array_equal(decode.state.draft_tokens[0], single.state.draft_tokens[0])
        assert single.state.seq_lens_this_time[0] in (0, K + 1)      # K drafts from the first decode round on
        if want and want[-1] == 257:
            break
    else:
        pytest.fail("the prompt was chosen to reach EOS within 10 tokens")


def test_prefill_role_reports_first_token_and_one_draft(prompt):
    """P's output (PD_MTP_FLOW §4.3, docs/design.md §6 decision 9): the message reports [t0] for a completed
    prompt whose t0 does not terminate, `first_draft_tokens` carries d1 for that slot (-1 for the idle one), and
    the slot is stopped after one step (schedule_cache row One)."""
    L = len(prompt)
    prefill = make_runner("prefill")
    output = prefill.execute_model(StepPlan(0, prefill_tasks=[PrefillTask(0, 0, L, L, tuple(prompt), (),
                                                                          tuple(range(8)), SAMPLING)]))
    assert step_message.decode_step_message(output.message)[1][0] == [int(prefill.state.draft_tokens[0, 0])]
    assert output.first_draft_tokens.tolist() == [int(prefill.state.draft_tokens[0, 1]), -1]
    assert prefill.state.stop_flags[0] and not prefill.state.not_need_stop[0]
