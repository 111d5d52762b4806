"""The offline API (README "Offline API"): parameter validation, per-request failures, prompt forms, resource stats."""
from __future__ import annotations

import sys

import pytest

from fastdeploy import LLM, SamplingParams


@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("top_p", 0.0), ("top_p", 1.5),
                                          ("max_tokens", 0), ("min_tokens", -1), ("stop", [""]),
                                          ("stop_token_ids", [-2]), ("seed", -1), ("max_tokens", True)])
def test_sampling_params_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"'{field}'"):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens_is_rejected():
    with pytest.raises(ValueError, match="'min_tokens'"):
        SamplingParams(max_tokens=2, min_tokens=3)


@pytest.fixture(scope="module")
def llm():
    return LLM(model="fd-toy", speculative_config={"method": "mtp", "num_speculative_tokens": 1},
               max_num_seqs=2, block_size=4, max_model_len=32)


def test_bad_request_fails_alone(llm):
    """DESIGN "Errors": a request too long for max_model_len fails with a message; the others complete."""
    outputs = llm.generate(["hi", "x" * 40, [256, 65]], SamplingParams(max_tokens=5))
    assert [o.outputs.finish_reason for o in outputs][1] == "abort"
    assert "max_model_len" in outputs[1].error
    assert all(o.error is None and o.outputs.token_ids for o in (outputs[0], outputs[2]))
    stats = llm.resource_stats()
    assert (stats.free_slots, stats.free_kv_blocks, stats.running_requests) == \
        (stats.total_slots, stats.total_kv_blocks, 0)


def test_prompt_plus_max_tokens_equal_to_max_model_len_fits_and_one_more_does_not(llm):
    """DESIGN "Errors": prompt + max_tokens == max_model_len (32) is served to its full length; 33 is refused."""
    prompt = [256] + [65] * 9                                  # 10 tokens
    fits, over = llm.generate([prompt, prompt], [SamplingParams(max_tokens=22, ignore_eos=True),
                                                 SamplingParams(max_tokens=23, ignore_eos=True)])
    assert fits.error is None
    assert (len(fits.outputs.token_ids), fits.outputs.finish_reason) == (22, "length")
    assert over.outputs.finish_reason == "abort" and "exceeds max_model_len (32)" in over.error
    stats = llm.resource_stats()
    assert (stats.free_slots, stats.free_kv_blocks) == (stats.total_slots, stats.total_kv_blocks)


def test_outputs_carry_ids_text_reason_and_metrics(llm):
    (out,) = llm.generate("hello", SamplingParams(max_tokens=6))
    assert out.prompt == "hello" and out.prompt_token_ids[0] == llm.tokenizer.bos_token_id
    assert out.outputs.finish_reason in ("stop", "length") and out.finished
    assert out.outputs.text == llm.tokenizer.decode([t for t in out.outputs.token_ids
                                                     if t != llm.tokenizer.eos_token_id])
    m = out.metrics
    assert m.num_decode_rounds == len(m.accepted_per_round) and m.num_draft_tokens == m.num_decode_rounds


def test_params_list_must_match_prompts(llm):
    with pytest.raises(ValueError, match="'params'"):
        llm.generate(["a", "b"], [SamplingParams()])


def test_unknown_speculative_method_is_rejected():
    with pytest.raises(ValueError, match="'method'"):
        LLM(model="fd-toy", speculative_config={"method": "eagle", "num_speculative_tokens": 1})


@pytest.mark.parametrize("prompts, argument", [(None, "'prompts'"), (42, "'prompts'"), ({"text": "hi"}, "'prompts'"),
                                               (["ok", None], r"'prompts\[1\]'"), ([[]], r"'prompts\[0\]'")],
                         ids=["none", "int", "dict", "none_in_list", "empty_ids"])
def test_wrong_prompt_types_raise_value_error_naming_the_argument(llm, prompts, argument):
    """`generate(None)` and friends fail with a clear ValueError, not a traceback."""
    with pytest.raises(ValueError, match=argument):
        llm.generate(prompts, use_tqdm=False)


def test_params_as_dict_raise_value_error_naming_params(llm):
    with pytest.raises(ValueError, match="'params'.*SamplingParams"):
        llm.generate("hi", {"max_tokens": 4}, use_tqdm=False)


@pytest.mark.parametrize("prompt", ["", "   \n"])
def test_empty_or_whitespace_prompt_is_refused_as_abort(llm, prompt):
    """SERVICES §3: an empty prompt is refused, not generated from BOS."""
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=4), use_tqdm=False)
    assert out.outputs.finish_reason == "abort" and "'prompt'" in out.error and out.outputs.token_ids == []


def test_stop_string_is_not_in_the_text_unless_asked(llm):
    """OpenAI convention: the text ends before the stop string; include_stop_str_in_output keeps it. The stop
    string is taken from the unconstrained output so that it certainly occurs."""
    free = llm.generate("abc", SamplingParams(max_tokens=12), use_tqdm=False)[0].outputs.text
    stop = free[3:5]
    cut, kept = llm.generate(["abc", "abc"], [SamplingParams(max_tokens=12, stop=stop),
                                              SamplingParams(max_tokens=12, stop=stop,
                                                             include_stop_str_in_output=True)], use_tqdm=False)
    assert cut.outputs.finish_reason == kept.outputs.finish_reason == "stop"
    head = free[:free.index(stop)]
    assert (cut.outputs.text, kept.outputs.text) == (head, head + stop)


def test_mtp_without_k_defaults_to_one_draft():
    """{"method": "mtp"} alone means K = 1 (FastDeploy's default)."""
    assert LLM(model="fd-toy", speculative_config={"method": "mtp"}).config.num_speculative_tokens == 1


def test_progress_bar_counts_every_prompt(llm, capsys, monkeypatch):
    """A tqdm bar on stderr over the prompts (refused ones included) when stderr is a terminal; nothing when it is
    not (a log file) or with use_tqdm=False."""
    llm.generate(["a", "b"], SamplingParams(max_tokens=2))
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    llm.generate(["a", "", "b"], SamplingParams(max_tokens=2))
    assert "3/3" in capsys.readouterr().err
    llm.generate(["a", "b"], SamplingParams(max_tokens=2), use_tqdm=False)
    assert capsys.readouterr().err == ""
