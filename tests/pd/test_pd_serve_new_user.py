"""What a new user found in `fastdeploy serve --pd` and `fastdeploy --help`: a bad
instance flag is one line and status 2 before anything starts, `--mtp` does not silently override
`--speculative-config`, `--host` is the router's, the supervisor names signals, and the help prints each default
once."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fastdeploy.entrypoints import pd_serve

REPO = Path(__file__).resolve().parents[2]


def fastdeploy(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastdeploy.entrypoints.cli", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("flags,message", [
    (("--speculative-config", "{bad"), "--speculative-config is not valid JSON"),
    (("--speculative-config", '{"method": "mtp", "num_speculative_tokens": -1}'), "num_speculative_tokens"),
    (("--mtp", "-1"), "--mtp must be >= 0, got -1"),
    (("--mtp", "1", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}'),
     "--mtp and --speculative-config both set the speculative decoding; give one"),
], ids=["malformed-json", "negative-k", "negative-mtp", "mtp-and-config"])
def test_a_bad_instance_flag_is_one_line_and_status_2_before_anything_starts(flags, message):
    result = fastdeploy("serve", "--pd", "--model", "fd-toy", "--port", "1", *flags)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == ""


def test_mtp_and_speculative_config_together_are_refused_without_pd_too():
    result = fastdeploy("serve", "--mtp", "1", "--speculative-config", '{"method": "mtp"}')
    assert result.returncode == 2 and "give one" in result.stderr, result.stderr


def test_the_routers_host_is_the_one_given():
    """`serve --pd --host H`: the router listens on H (its busy port is reported there); loopback by default."""
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = fastdeploy("serve", "--pd", "--host", "0.0.0.0", "--port", str(port))
    assert result.returncode == 3 and f"cannot listen on 0.0.0.0:{port}" in result.stderr, result.stderr
    router = pd_serve.router_child("0.0.0.0", 9000, {})
    assert router.argv[router.argv.index("--host") + 1] == "0.0.0.0" and router.url == "http://127.0.0.1:9000"


def test_the_supervisor_names_the_signal_that_ended_a_child(capsys):
    child = pd_serve._Child("decode instance", [sys.executable, "-c", "import time; time.sleep(60)"], 1, dict(os.environ))
    child.start()
    try:
        child.popen.send_signal(signal.SIGKILL)
        child.popen.wait(30)
        pd_serve._supervise_once(child, now=child.started_at)
    finally:
        if child.popen.poll() is None:
            child.popen.kill()
            child.popen.wait()
    assert "fastdeploy serve --pd: decode instance was killed by SIGKILL; restarting in 1 s" in capsys.readouterr().err
    assert pd_serve.exit_description(2) == "exited with status 2"


def test_help_prints_each_default_once_and_names_what_serve_runs():
    top = " ".join(fastdeploy("--help").stdout.split())
    assert "serve run the OpenAI-compatible API server of one instance, or with --pd a local PD deployment" in top
    serve = " ".join(fastdeploy("serve", "--help").stdout.split())
    assert not re.search(r"default[^()]*\) \(default:", serve), serve
    assert "(default: the HTTP port)" in serve and "(default: 8180)" in serve


def test_no_process_of_the_project_prints_paddles_ccache_warning():
    """`import paddle` warns "No ccache found" (it matters only to JIT-built extensions); every process imports
    fastdeploy before Paddle, which silences it."""
    result = subprocess.run([sys.executable, "-c", "import fastdeploy, paddle"], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0 and "ccache" not in result.stderr, result.stderr
