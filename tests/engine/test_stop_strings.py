"""Stop strings end the request offline (`LLM.generate`, `fastdeploy generate --stop`) wherever the token boundaries
fall, as the HTTP server does (docs/serving.md "Request fields", `stop`): the request emits the tokens up to the one
whose text completed the stop string, and its logprobs are as many. A tiny Qwen3 checkpoint with a byte-level BPE
tokenizer (tests/checkpoint_files.py), so that a stop string encoded alone need not be the ids the model emits (the
' sky' / 'sky' case); fd-toy with MTP for a stop the engine matches as ids in a step that emits several tokens."""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.entrypoints.cli import main
from tests.checkpoint_files import write_numpy_checkpoint

PROMPT = "hello world"
GREEDY = dict(temperature=0, max_tokens=48, logprobs=0)


def stop_inside_tokens(tokenizer, ids: list[int]) -> tuple[str, int]:
    """A two-character stop string from the greedy text whose ids, encoded alone, do not occur in `ids` (the
    engine's id match misses it), and the tokens the request emits with it: up to the one completing it."""
    text = tokenizer.decode(ids)
    for start in range(1, len(text) - 2):
        stop = text[start:start + 2]
        alone = tokenizer.encode(stop, add_special_tokens=False)
        inside = any(ids[i:i + len(alone)] == alone for i in range(len(ids)))
        if "\ufffd" not in stop and text.find(stop) == start and not inside:
            emitted = next(n for n in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:n]))
            return stop, emitted
    raise AssertionError(f"no stop string across token boundaries in {text!r}")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(write_numpy_checkpoint(tmp_path_factory.mktemp("stop") / "qwen3", "Qwen3ForCausalLM",
                                      tokenizer=True))


@pytest.fixture(scope="module", params=["single", "pd"])
def llm(request, checkpoint):
    return LLM(model=checkpoint, max_num_seqs=2, splitwise=request.param == "pd")


def test_stop_string_across_token_boundaries_ends_the_request_at_its_last_token(llm):
    (free,) = llm.generate(PROMPT, SamplingParams(**GREEDY), use_tqdm=False)
    stop, emitted = stop_inside_tokens(llm.tokenizer, free.outputs.token_ids)
    assert emitted < len(free.outputs.token_ids)
    for _ in range(3):   # the same figures every run
        (out,) = llm.generate(PROMPT, SamplingParams(**GREEDY, stop=[stop]), use_tqdm=False)
        assert out.outputs.text == free.outputs.text[:free.outputs.text.index(stop)]
        assert out.outputs.finish_reason == "stop" and out.error is None
        assert out.outputs.token_ids == free.outputs.token_ids[:emitted]
        assert len(out.outputs.logprobs) == emitted


def test_generate_cli_stop_ends_the_request_at_its_last_token(checkpoint, capsys):
    llm = LLM(model=checkpoint, max_num_seqs=1)
    (free,) = llm.generate(PROMPT, SamplingParams(**GREEDY), use_tqdm=False)
    stop, emitted = stop_inside_tokens(llm.tokenizer, free.outputs.token_ids)
    assert main(["generate", "--model", checkpoint, "--temperature", "0", "--max-tokens", "48", "--stop", stop,
                 PROMPT]) == 0
    out = capsys.readouterr().out
    assert f"[{emitted} tokens," in out and "finish: stop]" in out, out


def test_a_stop_the_engine_matches_as_ids_counts_no_token_after_it():
    """fd-toy (one byte a token) with MTP: the engine matches the stop's ids itself and ends with its EOS, maybe in
    a step that emitted more: the request emitted the stop string's tokens and no more, as on the other paths."""
    llm = LLM(model="fd-toy", speculative_config={"method": "mtp", "num_speculative_tokens": 2}, max_num_seqs=1)
    (free,) = llm.generate("abc", SamplingParams(**GREEDY), use_tqdm=False)
    text = free.outputs.text
    stop = text[4:6]
    (out,) = llm.generate("abc", SamplingParams(**GREEDY, stop=[stop]), use_tqdm=False)
    emitted = text.index(stop) + len(stop)
    assert out.outputs.text == text[:text.index(stop)] and out.outputs.finish_reason == "stop"
    assert out.outputs.token_ids == free.outputs.token_ids[:emitted] and len(out.outputs.logprobs) == emitted
