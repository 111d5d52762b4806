"""The `fastdeploy generate` command (README "Quick start")."""
from __future__ import annotations

from fastdeploy.entrypoints.cli import main


def test_generate_prints_completion_and_stats_line(capsys):
    assert main(["generate", "--model", "fd-toy", "--mtp", "1", "--max-tokens", "8", "hello"]) == 0
    text, stats = capsys.readouterr().out.rstrip("\n").rsplit("\n", 1)
    assert "tokens," in stats and "decode rounds" in stats and "mean accept length" in stats and "tokens/s" in stats


def test_generate_reports_a_bad_argument_without_a_traceback(capsys):
    assert main(["generate", "--model", "fd-toy", "--temperature", "-1", "hello"]) == 2
    assert "'temperature'" in capsys.readouterr().err
