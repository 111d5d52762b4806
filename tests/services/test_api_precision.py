"""A checkpoint served in a reduced precision through HTTP (docs/models.md "Precision"): `--dtype bfloat16
--quantization wint8` on the API server answers what the in-process engine in the same precision answers, and
its start line states the precision and the stored bytes; a bad --quantization is one line at start."""
from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest

from tests.checkpoint_files import write_numpy_checkpoint
from tests.services import launcher

PROMPT = [5, 9, 13, 21, 40, 7, 7]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_numpy_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", tokenizer=True)


def test_the_server_answers_as_the_engine_in_the_same_precision(checkpoint, tmp_path):
    from fastdeploy import LLM, SamplingParams
    llm = LLM(model=str(checkpoint), dtype="bfloat16", quantization="wint8", max_num_seqs=2)
    assert llm.engine.runner.kv.dtype == "bfloat16"   # --kv-cache-dtype auto: the model's
    want = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)[0]
    with launcher.serving("--max-num-seqs", "2", "--dtype", "bfloat16", "--quantization", "wint8",
                          model=str(checkpoint), log_dir=tmp_path) as server:
        body = httpx.post(f"{server.url}/v1/completions", timeout=60,
                          json={"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "ignore_eos": True,
                                "logprobs": 0}).json()
        log = server.log()
    assert body["choices"][0]["text"] == want.outputs.text, body
    assert body["usage"]["completion_tokens"] == len(want.outputs.token_ids)
    assert "MiB bfloat16, wint8, KV cache" in log, log[-2000:]
    assert re.search(r"KV cache [0-9.]+ MiB bfloat16 \(", log), log[-2000:]


def test_a_bad_quantization_is_one_line_at_start(checkpoint):
    done = subprocess.run([sys.executable, "-m", "fastdeploy.entrypoints.openai.api_server", "--model",
                           str(checkpoint), "--port", "1", "--quantization", "int3"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "'quantization'" in lines[-1] and "wint8" in lines[-1], lines[-5:]
