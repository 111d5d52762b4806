"""A checkpoint directory through the engine paths without the oracle (NumPy-written checkpoints, no torch): the
engine core's deltas, PD = single with K = 0, text prompts through the checkpoint's tokenizer, the start-up memory
line. Correctness against an independent implementation is test_checkpoint_oracle.py's."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from tests.checkpoint_files import write_numpy_checkpoint

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.layers import fused_attention
from fastdeploy.engine.engine_core import EngineCore
from fastdeploy.schema.core_protocol import AddRequest

ENGINE = dict(max_num_seqs=2, block_size=8, max_num_batched_tokens=24)
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module", params=["Ernie4_5ForCausalLM", "Qwen3ForCausalLM"])
def checkpoint(request, tmp_path_factory):
    return write_numpy_checkpoint(tmp_path_factory.mktemp("ckpt") / request.param, request.param, tokenizer=True)


def test_engine_core_deltas_are_the_llm_output(checkpoint):
    prompts = [[5, 6, 7, 8, 9, 10], [40, 41]]
    want = LLM(model=str(checkpoint), **ENGINE).generate(prompts, PARAMS, use_tqdm=False)
    core = EngineCore(LLM(model=str(checkpoint), **ENGINE).engine)
    for i, prompt in enumerate(prompts):
        core.handle(AddRequest(request_id=str(i), prompt_token_ids=prompt,
                               params={"max_tokens": 12, "temperature": 0, "ignore_eos": True}))
    deltas = []
    while core.has_work:
        deltas += core.step().deltas
    for i, expected in enumerate(want):
        assert [t for d in deltas if d.request_id == str(i) for t in d.new_token_ids] == expected.outputs.token_ids


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_pd_gives_the_single_instance_tokens(checkpoint, prefix_caching):
    """K = 0 over a model without MTP layers: P hands D a cache of the target layers only."""
    prompts = [list(range(3, 30)), list(range(3, 21)) + [99], [7, 8, 9]]
    single = LLM(model=str(checkpoint), **ENGINE).generate(prompts, PARAMS, use_tqdm=False)
    pd = LLM(model=str(checkpoint), splitwise=True, enable_prefix_caching=prefix_caching,
             **ENGINE).generate(prompts, PARAMS, use_tqdm=False)
    assert [o.outputs.token_ids for o in pd] == [o.outputs.token_ids for o in single]


def test_text_prompts_use_the_checkpoint_tokenizer(checkpoint):
    llm = LLM(model=str(checkpoint), **ENGINE)
    assert type(llm.tokenizer).__name__ != "ByteTokenizer"
    text = "Hello, world"
    by_text = llm.generate([text], PARAMS, use_tqdm=False)[0]
    by_ids = llm.generate([llm.tokenizer.encode(text)], PARAMS, use_tqdm=False)[0]
    assert by_text.outputs.token_ids == by_ids.outputs.token_ids
    assert by_text.outputs.text == llm.tokenizer.decode(by_text.outputs.token_ids)


def test_start_up_reports_weights_and_kv_memory(checkpoint, caplog):
    with caplog.at_level(logging.INFO, logger="fastdeploy.engine"):
        llm = LLM(model=str(checkpoint), **ENGINE)
    lines = [r.getMessage() for r in caplog.records if r.name == "fastdeploy.engine"]
    assert len(lines) == 1, lines
    blocks = llm.config.cache.num_kv_blocks
    assert f"mixed instance of {checkpoint}: weights " in lines[0] and " MiB float32, KV cache " in lines[0]
    assert f"({blocks} blocks x 8 tokens, 2 layers x (2, 2, " in lines[0] and "max_model_len 512" in lines[0]


@pytest.mark.skipif(not fused_attention.AVAILABLE, reason="the fused prefill op needs the CPU's own AVX-512 kernels")
def test_a_long_prompt_gives_the_same_bits_in_any_chunks_and_after_a_prefix_hit(checkpoint, monkeypatch):
    """OPS §11.3 with the own float32 linear kernel (OPS §10.5), both one chain per row whatever the rows around
    it: a 300-token prompt's logprobs are bit for bit the same prefilled in chunks of 160 or of 256 tokens, and
    after a prefix-cache hit on its first 256; every chunk went through fd_cpu_prefill_attention. Qwen3's per-head
    q / k norm runs through Paddle's reductions, whose last bits follow the row count: there the tokens are equal
    and the logprobs within rounding."""
    calls = []
    real_op = fused_attention.prefill_attention
    monkeypatch.setattr(fused_attention, "prefill_attention", lambda q, *a: calls.append(q.shape[0]) or real_op(q, *a))
    rng = np.random.default_rng(7)
    shared = [int(t) for t in rng.integers(3, 200, 256)]
    prompt = shared + [int(t) for t in rng.integers(3, 200, 44)]
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=5, ignore_eos=True)

    def run(chunk: int, warm: list[int] | None = None):
        llm = LLM(model=str(checkpoint), max_num_seqs=2, block_size=16, max_num_batched_tokens=chunk,
                  max_model_len=512)
        if warm is not None:
            llm.generate([warm], params, use_tqdm=False)
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        return out.num_cached_tokens, [(lp.token_id, lp.logprob, lp.top_logprobs) for lp in out.outputs.logprobs]

    def same(got, want):
        if checkpoint.name.startswith("Ernie"):
            assert got == want
        else:
            assert [t for t, _, _ in got] == [t for t, _, _ in want]
            np.testing.assert_allclose([lp for _, _, lp in got], [lp for _, _, lp in want], rtol=0, atol=1e-4)

    cached, whole = run(256)
    assert cached == 0 and set(calls) == {256, 44}
    cached, chunked = run(160)
    assert cached == 0
    same(chunked, whole)
    calls.clear()
    cached, after_hit = run(512, warm=shared + [1, 2, 3])
    assert cached == 256 and calls[-1] == 44
    same(after_hit, whole)
