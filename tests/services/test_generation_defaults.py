"""A checkpoint's generation_config.json sampling values as request defaults (docs/serving.md, "Sampling
defaults"; vLLM's `--generation-config auto|vllm|FOLDER`): a request's own value wins, `vllm` reads none, a bad
value stops the server at start naming the file and the field. No processes: the request path as the API server
runs it (OpenAIServing.sampling) on a checkpoint written by tests/checkpoint_files.py."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from fastdeploy.entrypoints.chat_template import ChatTemplate
from fastdeploy.entrypoints.openai.generation_defaults import sampling_defaults
from fastdeploy.entrypoints.openai.protocol import ChatCompletionRequest
from fastdeploy.entrypoints.openai.serve_args import build_parser, check_args
from fastdeploy.entrypoints.openai.serving_engine import OpenAIServing, ServingSettings
from fastdeploy.metrics.metrics import ServerMetrics
from fastdeploy.model_executor.models.tokenizer import get_tokenizer
from tests.checkpoint_files import write_numpy_checkpoint

QWEN3_LIKE = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05, "do_sample": True}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = write_numpy_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", tokenizer=True)
    path = directory / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **QWEN3_LIKE}))
    return directory


def _params(defaults: dict, **fields):
    settings = ServingSettings(model_names=("m",), role="mixed", max_model_len=512, max_concurrency=None,
                               max_body_bytes=1 << 20, sampling_defaults=defaults)
    serving = OpenAIServing(SimpleNamespace(), get_tokenizer("fd-toy"), ChatTemplate(), ServerMetrics(), settings)
    request = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})
    return serving.sampling(request, 8)[0]


def test_auto_reads_the_sampling_values_and_requests_override_them(checkpoint):
    defaults = sampling_defaults(str(checkpoint), "auto")
    assert defaults == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05}
    params = _params(defaults)
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (0.6, 0.95, 20, 1.05)
    params = _params(defaults, temperature=0, top_k=0, min_p=0.1)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.0, 0.95, 0, 0.1)


def test_vllm_reads_none_and_a_folder_is_read_instead_of_the_model(checkpoint, tmp_path):
    assert sampling_defaults(str(checkpoint), "vllm") == {}
    params = _params({})
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (0.0, 1.0, 0, 1.0)
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 0.5}))
    assert sampling_defaults("fd-toy", str(tmp_path)) == {"top_p": 0.5}
    assert sampling_defaults("fd-toy", "auto") == {}   # an embedded model has no generation_config.json


def test_a_bad_value_or_a_missing_folder_stops_the_server_in_one_line(checkpoint, tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": -4}))
    args = build_parser().parse_args(["--model", str(checkpoint), "--generation-config", str(tmp_path)])
    problem = check_args(args)
    assert problem is not None and "generation_config.json" in problem and "'top_k'" in problem, problem
    args = build_parser().parse_args(["--model", str(checkpoint), "--generation-config", str(tmp_path / "no")])
    assert "no generation_config.json" in check_args(args)
    assert check_args(build_parser().parse_args(["--model", str(checkpoint)])) is None
