"""`fastdeploy chat`: a conversation with an in-process LLM in the terminal (README "Offline API").

Each line read is a user message; the whole conversation so far goes through the model's chat template
(LLM.chat_prompts) and the reply is printed as its tokens come (LLM.stream), then joins the history. `/exit`, or
EOF (Ctrl-D), ends the session; `/clear` forgets the history. Ctrl-C during a reply stops that reply (what was
shown stays in the history, marked as cut short) and returns to the prompt; Ctrl-C at the prompt ends the session
with exit status 0 and one line, no traceback.
"""
from __future__ import annotations

import signal
import sys
from typing import TextIO

from fastdeploy.schema.sampling_params import SamplingParams

PROMPT = "> "
EXIT_COMMANDS = ("/exit", "/quit")


def chat_loop(llm, params: SamplingParams, system: str | None = None, chat_template: str | None = None,
              stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Run the session on `stdin` / `stdout` (default: the process's); returns the exit status (0).
    `chat_template`: a Jinja file instead of the model's template. A model without a template: ValueError."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    opening = [{"role": "system", "content": system}] if system else []
    llm.chat_prompts(opening + [{"role": "user", "content": "hello"}], chat_template)   # no template: fail now
    try:
        _converse(llm, params, opening, chat_template, stdin, stdout)
    except KeyboardInterrupt:   # outside a reply (at the prompt): the user wants out
        stdout.write("\n")
    return 0


def _converse(llm, params: SamplingParams, opening: list[dict], chat_template: str | None, stdin: TextIO,
              stdout: TextIO) -> None:
    history = list(opening)
    interactive = stdin.isatty()
    stdout.write(f"chat with {llm.model.name}: /exit or Ctrl-D ends, /clear forgets, Ctrl-C stops a reply\n")
    stdout.flush()
    while True:
        line = _read_line(stdin, stdout, interactive)
        if not line:               # EOF
            if interactive:
                stdout.write("\n")
            return
        text = line.strip()
        if text in EXIT_COMMANDS:
            return
        if text == "/clear":
            history = list(opening)
            continue
        if not text:
            continue
        history.append({"role": "user", "content": text})
        reply, cut = _reply(llm, llm.chat_prompts(history, chat_template)[0], params, stdout)
        if reply is None:   # refused (e.g. the conversation outgrew max_model_len): the turn is dropped
            history.pop()
            continue
        history.append({"role": "assistant", "content": reply})
        if cut:
            stdout.write("[reply stopped]\n")


def _read_line(stdin: TextIO, stdout: TextIO, interactive: bool) -> str:
    """The next line ("" at EOF); on a terminal after the prompt, with line editing (input())."""
    if interactive and stdin is sys.stdin and stdout is sys.stdout:
        try:
            return input(PROMPT) + "\n"
        except EOFError:
            return ""
    if interactive:
        stdout.write(PROMPT)
        stdout.flush()
    return stdin.readline()


def _reply(llm, prompt: list[int], params: SamplingParams, stdout: TextIO) -> tuple[str | None, bool]:
    """Stream one reply; (its text, whether Ctrl-C cut it), or (None, False) when the engine refused it."""
    interrupted = []
    # Ctrl-C now only sets a flag, which the stream reads between engine steps: never mid-step
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    try:
        stream = llm.stream(prompt, params, cancelled=lambda: bool(interrupted))
        for piece in stream:
            stdout.write(piece)
            stdout.flush()
        stdout.write("\n")
    finally:
        signal.signal(signal.SIGINT, previous)
    output = stream.output
    if output.error and not interrupted:
        stdout.flush()
        print(f"fastdeploy chat: error: {output.error}", file=sys.stderr)
        return None, False
    return output.outputs.text, bool(interrupted)
