"""`--model PATH` in the front end's flags (no server started): the served name is the directory's, the checks
are one line naming the path, --max-model-len is the model's unless given, and `fastdeploy serve --pd` passes the
model, tokenizer, served names and chat template to every instance."""
from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from fastdeploy.entrypoints import pd_serve
from fastdeploy.entrypoints.cli import build_parser as cli_parser
from fastdeploy.entrypoints.openai.serve_args import build_parser, check_model_args, served_model_names
from tests.checkpoint_files import ERNIE_SHAPE
from tests.tokenizer_files import write_ernie_tokenizer


def _config(directory, architecture="Ernie4_5ForCausalLM") -> None:
    """A config.json and a weight file that read_checkpoint_config accepts (the weights are never loaded here)."""
    (directory / "config.json").write_text(json.dumps({**ERNIE_SHAPE, "architectures": [architecture],
                                                       "model_type": "ernie4_5", "torch_dtype": "float32"}))
    save_file({"model.norm.weight": np.ones(ERNIE_SHAPE["hidden_size"], np.float32)},
              str(directory / "model.safetensors"))


@pytest.fixture()
def checkpoint(tmp_path):
    directory = tmp_path / "ERNIE-4.5-tiny"
    directory.mkdir()
    _config(directory)
    write_ernie_tokenizer(directory)
    return directory


def test_served_name_is_the_directory_name(checkpoint):
    parse = build_parser().parse_args
    assert served_model_names(parse(["--model", f"{checkpoint}/"])) == ("ERNIE-4.5-tiny",)
    assert served_model_names(parse(["--model", "fd-toy"])) == ("fd-toy",)
    assert served_model_names(parse(["--model", str(checkpoint), "--served-model-name", "a", "b"])) == ("a", "b")
    assert parse([]).max_model_len is None and parse(["--max-model-len", "64"]).max_model_len == 64


@pytest.mark.parametrize("case", ["missing", "no-tokenizer", "bad-tokenizer-flag", "unsupported"])
def test_bad_model_paths_are_one_line(checkpoint, tmp_path, case):
    flags = {"missing": ["--model", str(tmp_path / "nope")],
             "no-tokenizer": ["--model", str(tmp_path)],
             "bad-tokenizer-flag": ["--model", str(checkpoint), "--tokenizer", str(tmp_path)],
             "unsupported": ["--model", str(checkpoint)]}[case]
    if case == "unsupported":
        _config(checkpoint, "GPT2LMHeadModel")
    if case == "no-tokenizer":
        _config(tmp_path)
    problem = check_model_args(build_parser().parse_args(flags))
    expected = {"missing": "not a checkpoint directory", "no-tokenizer": "no tokenizer",
                "bad-tokenizer-flag": "--tokenizer", "unsupported": "'GPT2LMHeadModel'"}[case]
    assert problem is not None and expected in problem and "\n" not in problem, problem


def test_a_good_checkpoint_and_the_embedded_names_pass(checkpoint):
    assert check_model_args(build_parser().parse_args(["--model", str(checkpoint)])) is None
    assert check_model_args(build_parser().parse_args(["--model", "fd-tiny"])) is None


def test_serve_pd_passes_the_model_flags_to_every_instance(checkpoint, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 1, "model": str(tmp_path / "mtp")})
    args = cli_parser().parse_args(["serve", "--pd", "--model", str(checkpoint), "--tokenizer", str(checkpoint),
                                    "--served-model-name", "one", "two", "--chat-template", str(template),
                                    "--speculative-config", spec, "--num-decode", "2"])
    for role in ("prefill", "decode"):
        argv = pd_serve._instance_argv(args, role, 1234, 5678)
        flags = build_parser().parse_args(argv[3:])
        assert (flags.model, flags.tokenizer, flags.served_model_name, flags.chat_template) == (
            str(checkpoint), str(checkpoint), ["one", "two"], str(template))
        assert flags.speculative_config == spec      # passed through unchanged, its "model" key included
