"""The user-facing PD entry points: `LLM(..., splitwise=True)` gives the same generate() results
and metrics as a single instance, plus P and D timings; `fastdeploy generate --pd --mtp 1 "text"`."""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.entrypoints.cli import main
from tests.e2e.workloads import TOY_ENGINE

from .harness import workload

MTP = {"method": "mtp", "num_speculative_tokens": 2}


@pytest.mark.parametrize("spec", [None, MTP], ids=["no_spec", "mtp"])
def test_splitwise_llm_generates_the_same_outputs_and_metrics(spec):
    """O1 and O2 through the public API: text, tokens, finish reason and speculation metrics equal the single
    instance's; every request carries ordered PD timings; both instances end with every slot and block free."""
    cases = workload(11)[:30]
    prompts, params = [c.prompt for c in cases], [c.params for c in cases]
    single = LLM(speculative_config=spec, **TOY_ENGINE).generate(prompts, params)
    llm = LLM(speculative_config=spec, splitwise=True, **TOY_ENGINE)
    pd = llm.generate(prompts, params)
    for case, want, got in zip(cases, single, pd):
        assert got.error is None, f"{case.name}: {got.error}"
        assert got.outputs == want.outputs, case.name
        assert got.metrics == want.metrics, case.name
        t = got.pd_timings
        assert t.arrival_s <= t.prefill_start_s <= t.first_token_s <= t.finished_s, case.name
        assert want.pd_timings is None
    for name, stats in llm.resource_stats().items():
        assert (stats.free_slots, stats.free_kv_blocks, stats.running_requests) == \
            (stats.total_slots, stats.total_kv_blocks, 0), name


def test_splitwise_llm_rejects_a_bad_request_alone():
    """DESIGN "Errors" under PD: a request too long for max_model_len fails at submission; the others run."""
    llm = LLM(model="fd-toy", speculative_config=MTP, splitwise=True, max_num_seqs=2, block_size=4, max_model_len=32)
    outputs = llm.generate(["hi", "x" * 40], SamplingParams(max_tokens=5))
    assert outputs[0].error is None and len(outputs[0].outputs.token_ids) >= 1
    assert outputs[1].outputs.finish_reason == "abort" and "max_model_len" in outputs[1].error


def test_cli_generate_pd_mtp_prints_the_single_instance_completion_and_pd_timings(capsys):
    """`fastdeploy generate --pd --mtp 1 "text"`: same completion as without --pd, plus a PD timing line."""
    argv = ["generate", "--model", "fd-toy", "--mtp", "1", "--max-tokens", "12", "hello"]
    assert main(argv) == 0
    single_text = capsys.readouterr().out.splitlines()[0]
    assert main([*argv[:1], "--pd", *argv[1:]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == single_text
    assert lines[-1].startswith("[PD: time to first token ") and "decode on D" in lines[-1]
