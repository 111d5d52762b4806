"""`fastdeploy chat` (README "Offline API", entrypoints/chat_cli.py): each line is a user message sent with the
conversation so far through the model's chat template, the reply streams and joins the history; `/exit` or EOF ends
the session; Ctrl-C during a reply stops that reply only, Ctrl-C at the prompt ends the session with status 0 and
no traceback. Driven through stdin: a pipe in a subprocess, a StringIO in this process."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.entrypoints.chat_cli import chat_loop

REPO = Path(__file__).resolve().parents[2]
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
CHAT = [sys.executable, "-m", "fastdeploy.entrypoints.cli", "chat", "--temperature", "0", "--max-tokens", "12"]


def chat_process(*flags: str) -> subprocess.Popen:
    return subprocess.Popen([*CHAT, *flags], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def llm():
    return LLM(model="fd-tiny", max_num_seqs=1)


class Recorder:
    """Wraps llm.stream: the prompts of the replies and their outputs."""

    def __init__(self, llm: LLM, monkeypatch):
        self.prompts, self.streams, stream = [], [], llm.stream

        def recorded(prompt, params=None, cancelled=lambda: False):
            self.prompts.append(list(prompt))
            self.streams.append(stream(prompt, params, cancelled))
            return self.streams[-1]
        monkeypatch.setattr(llm, "stream", recorded)


@pytest.mark.parametrize("ending", ["/exit\n", ""])
def test_chat_on_a_pipe_answers_each_line_and_ends_at_exit_or_eof(ending, llm):
    """The embedded default model (no --model), as `fastdeploy generate`."""
    process = chat_process()
    out, err = process.communicate("hello\nwho are you\n" + ending, timeout=120)
    assert process.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    first = llm.chat([{"role": "user", "content": "hello"}], SamplingParams(temperature=0, max_tokens=12),
                     use_tqdm=False)[0].outputs.text
    lines = out.splitlines()
    assert lines[0].startswith("chat with fd-tiny") and lines[1] == first.split("\n")[0], out


def test_each_reply_is_generated_from_the_whole_conversation(llm, monkeypatch):
    recorder = Recorder(llm, monkeypatch)
    out = io.StringIO()
    assert chat_loop(llm, PARAMS, system="be brief", stdin=io.StringIO("hello\nagain\n"), stdout=out) == 0
    first = recorder.streams[0].output.outputs.text
    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"},
               {"role": "assistant", "content": first}, {"role": "user", "content": "again"}]
    assert recorder.prompts[1] == llm.chat_prompts(history)[0]
    assert recorder.streams[1].output.outputs.text == llm.chat(history, PARAMS, use_tqdm=False)[0].outputs.text
    assert f"{first}\n" in out.getvalue()


def test_ctrl_c_during_a_reply_stops_it_and_the_next_line_is_answered(llm, monkeypatch):
    recorder = Recorder(llm, monkeypatch)
    step, steps = llm.engine.step, []

    def step_then_ctrl_c(*args, **kwargs):   # Ctrl-C arrives during the first reply's third step
        steps.append(1)
        if len(steps) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return step(*args, **kwargs)
    monkeypatch.setattr(llm.engine, "step", step_then_ctrl_c)
    handler = signal.getsignal(signal.SIGINT)
    out = io.StringIO()
    assert chat_loop(llm, PARAMS, stdin=io.StringIO("hello\nagain\n"), stdout=out) == 0
    cut, second = (s.output for s in recorder.streams)
    assert cut.outputs.finish_reason == "abort" and len(cut.outputs.token_ids) < PARAMS.max_tokens
    assert second.outputs.finish_reason == "length" and len(second.outputs.token_ids) == PARAMS.max_tokens
    assert "[reply stopped]" in out.getvalue()
    assert signal.getsignal(signal.SIGINT) is handler   # the prompt's handling is back


def test_ctrl_c_at_the_prompt_ends_the_session_with_status_0_and_no_traceback():
    process = chat_process()
    try:
        assert process.stdout.readline().startswith("chat with fd-tiny")   # loaded, waiting for a line
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert out == "\n"


def test_a_chat_template_that_cannot_be_read_is_one_line_before_the_first_prompt(tmp_path):
    process = chat_process("--chat-template", str(tmp_path / "missing.jinja"))
    out, err = process.communicate("hello\n", timeout=120)
    assert process.returncode == 2 and out == ""
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("fastdeploy chat: error: --chat-template "), err[-3000:]
