"""The `fastdeploy generate` command (README "Quick start")."""
from __future__ import annotations

import pytest

from fastdeploy import LLM
from fastdeploy.entrypoints.cli import main


def test_generate_prints_completion_and_stats_line(capsys):
    assert main(["generate", "--model", "fd-toy", "--mtp", "1", "--max-tokens", "8", "hello"]) == 0
    text, stats = capsys.readouterr().out.rstrip("\n").rsplit("\n", 1)
    assert "tokens," in stats and "decode rounds" in stats and "mean accept length" in stats and "tokens/s" in stats


def test_generate_reports_a_bad_argument_without_a_traceback(capsys):
    assert main(["generate", "--model", "fd-toy", "--temperature", "-1", "hello"]) == 2
    assert "'temperature'" in capsys.readouterr().err


HUB_ID = "baidu/ERNIE-4.5-0.3B-PT"   # a hub id, not a directory here


def test_a_hub_id_is_refused_with_how_to_get_the_directory(capsys, tmp_path, monkeypatch):
    """Only local directories are read: a hub id gets one line saying to download it first, from the server's,
    the generate command's and the offline API's checks."""
    monkeypatch.chdir(tmp_path)
    for argv in (["serve", "--model", HUB_ID], ["generate", "--model", HUB_ID, "hi"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert "only local checkpoint directories are read" in err and "download it first" in err, err
    with pytest.raises(ValueError, match="download it first"):
        LLM(model=HUB_ID)
