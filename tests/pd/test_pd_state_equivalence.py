"""I3 at engine level (PD_MTP_FLOW §5.3–§5.6): the state D's runner holds for a request right after its
insertion equals, field by field, the state a single instance holds at the start of the step after the
request's prompt completed — except the fields PD_MTP_FLOW §5.6 exempts. The runner-level twin is
tests/engine/test_decode_insertion.py; this one goes through the PD engine, the connector and the KV transfer."""
from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.entrypoints.llm import LLM
from fastdeploy.model_executor.models import get_model
from tests.e2e.workloads import TOY_ENGINE, Case

from .harness import drive, start_pd, submit

# PD_MTP_FLOW §5.6 exemptions: prompt_lens (L + 1 on D), accept_num / accept_tokens (overwritten by verify before they
# are read), block ids, input_ids; the step_* fields are written when a slot parks, before anything reads them.
# Only state the next steps read is compared (below: pre_ids up to step_idx, draft_tokens up to the input length).
EXEMPT = {"prompt_lens", "accept_num", "accept_tokens", "block_tables", "input_ids", "step_seq_lens_this_time",
          "step_draft_tokens", "step_seq_lens_decoder", "not_need_stop", "eos_token_id", "views"}
# The proposer's own state; PD_MTP_FLOW §5.4's other proposer fields are the target's here (docs/design.md §5).
PROPOSER_FIELDS = ("seq_lens_encoder", "seq_lens_decoder")


def slot_state(runner, slot: int) -> dict:
    state = runner.state
    row = {name: np.array(getattr(state, name)[slot]) for name in state.__dataclass_fields__ if name not in EXEMPT}
    # Only the positions the next round feeds are read: draft_tokens[b, :seq_lens_this_time].
    row["draft_tokens"] = row["draft_tokens"][:int(state.seq_lens_this_time[slot])]
    # Stop matching reads the history pre_ids[1 .. step_idx] (OPS §5.3); later entries are written before read.
    row["pre_ids"] = row["pre_ids"][:int(state.step_idx[slot]) + 1]
    row["prompt_lens"] = int(state.prompt_lens[slot])
    row["proposer"] = {name: int(getattr(runner.proposer, name)[slot]) for name in PROPOSER_FIELDS} \
        if runner.proposer is not None else None
    row["sampling"] = runner.sampling[slot]
    return row


def single_after_prompt(prompts: list[list[int]], params: SamplingParams, k: int) -> list[dict]:
    """Per prompt, the single instance's slot state at the end of the step that completed its prompt."""
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    llm = LLM(speculative_config=spec, model_options={"mtp_agreement": 0.5}, **TOY_ENGINE)
    runner, snapshots = llm.engine.runner, {}
    execute = runner.execute_model

    def execute_and_snapshot(plan):
        output = execute(plan)
        for task in plan.prefill_tasks:
            if task.completes_prefill:
                snapshots[llm.engine.resources.owner(task.slot).request_id] = slot_state(runner, task.slot)
        return output

    runner.execute_model = execute_and_snapshot
    llm.generate(prompts, params)
    return [snapshots[str(i)] for i in range(len(prompts))]


def d_after_insertion(prompts: list[list[int]], params: SamplingParams, k: int) -> list[dict]:
    pd = start_pd(k, model_options={"mtp_agreement": 0.5})
    runner, snapshots = pd.engine.decode.runner, {}
    insert = runner.insert_tasks

    def insert_and_snapshot(plan):
        insert(plan)
        for task in plan.decode_tasks:
            snapshots[pd.engine.decode.resources.owner(task.slot).request_id] = slot_state(runner, task.slot)

    runner.insert_tasks = insert_and_snapshot
    submit(pd, [Case(str(i), p, params) for i, p in enumerate(prompts)])
    drive(pd)
    return [snapshots[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("k", [0, 1, 2])
def test_d_state_after_insertion_equals_single_instance_after_prompt(k):
    """I3: every non-exempt per-slot field (target and proposer) and the slot's sampling values are equal;
    prompt_lens is L + 1 on D and L on the single instance; with MTP, D feeds [t0, d1] (two positions)."""
    model = get_model("fd-toy")
    prompts = [model.find_prompt(eos_index=12, prompt_len=n, seed=90 + n) for n in (5, 9, 13)]
    params = SamplingParams(max_tokens=20, min_tokens=3, seed=1234, stop=["zz"])
    single = single_after_prompt(prompts, params, k)
    decode = d_after_insertion(prompts, params, k)
    for prompt, want, got in zip(prompts, single, decode):
        assert got.pop("prompt_lens") == len(prompt) + 1 and want.pop("prompt_lens") == len(prompt)
        assert got.keys() == want.keys()
        for name in got:
            if isinstance(got[name], np.ndarray):
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
            else:
                assert got[name] == want[name], name
        assert len(got["draft_tokens"]) == (2 if k else 1)
