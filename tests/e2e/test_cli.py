"""The `fastdeploy generate` command (README "Quick start"): its output on a terminal and elsewhere, Ctrl-C and
its one-line errors."""
from __future__ import annotations

import io
import sys

import pytest

from fastdeploy import LLM, SamplingParams
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


class Terminal(io.StringIO):
    """A stdout that is a terminal, recording each write."""

    def __init__(self):
        super().__init__()
        self.writes: list[str] = []

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_generate_streams_the_text_on_a_terminal(monkeypatch):
    """On a terminal the text is written as its tokens come (many writes), and reads as the non-streamed text."""
    argv = ["generate", "--model", "fd-tiny", "--temperature", "0", "--max-tokens", "24", "hello"]
    (want,) = LLM(model="fd-tiny").generate("hello", SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    assert main(argv) == 0
    text, stats = terminal.getvalue().rstrip("\n").rsplit("\n", 1)
    assert text == want.outputs.text and "tokens/s" in stats
    assert len([w for w in terminal.writes if w.strip()]) > 3, terminal.writes


def test_generate_prints_no_progress_bar_when_stderr_is_not_a_terminal(capsys):
    assert main(["generate", "--model", "fd-tiny", "--max-tokens", "4", "hello"]) == 0
    err = capsys.readouterr().err
    assert "req/s" not in err and "it/s" not in err, err


def test_every_command_error_has_the_fastdeploy_command_prefix(capsys):
    """`fastdeploy COMMAND: error: ...`, argparse's form, whichever check refuses."""
    for argv in (["generate", "--temperature", "-1", "hi"], ["generate", "--kv-cache-memory-bytes", "lots", "hi"],
                 ["chat", "--top-p", "2"], ["serve", "--mtp", "-1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"fastdeploy {argv[0]}: error: "), (argv, err)
