"""The API server's command line (SERVICES §2): `fastdeploy serve` runs the same server; `--help` shows every
default; unknown or contradictory flags exit with status 2 and one line, for both `python -m ...api_server` and
`fastdeploy serve`."""
from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest

from tests.services import launcher
from tests.services.launcher import API_SERVER, REPO

COMMANDS = {"module": [sys.executable, "-m", API_SERVER],
            "cli": [sys.executable, "-m", "fastdeploy.entrypoints.cli", "serve"]}
BAD_FLAGS = [("unknown_flag", ["--bogus"]), ("pd_port_without_pd_role", ["--pd-comm-port", "9100"]),
             ("decode_without_router", ["--splitwise-role", "decode"]), ("bad_role", ["--splitwise-role", "both"]),
             ("speculative_not_json", ["--speculative-config", "{mtp"]),
             ("speculative_unknown_method", ["--speculative-config", '{"method": "eagle"}']),
             ("port_out_of_range", ["--port", "70000"]), ("zero_concurrency", ["--max-concurrency", "0"]),
             ("bad_max_model_len", ["--max-model-len", "1"])]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60)


# every case through the module; two through `fastdeploy serve` (the same checks; each run costs an interpreter)
CASES = [("module", *case) for case in BAD_FLAGS] + [("cli", *case) for case in BAD_FLAGS[:2]]


@pytest.mark.parametrize("command,case,flags", CASES, ids=[f"{c}-{n}" for c, n, _ in CASES])
def test_bad_flags_exit_2_with_one_line(command, case, flags):
    result = _run(COMMANDS[command] + flags)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "error:" in result.stderr, result.stderr
    assert result.stdout == ""


def test_help_shows_every_default():
    """Every option of `--help` says its default (argparse's defaults formatter)."""
    text = _run(COMMANDS["module"] + ["--help"]).stdout
    options = re.findall(r"^  (--[a-z-]+)", text, flags=re.M)
    assert len(options) >= 20
    blocks = re.split(r"\n(?=  --)", text.split("options:")[1])
    missing = [b.split()[0] for b in blocks if b.strip().startswith("--") and "(default:" not in b]
    assert not missing, missing


def test_fastdeploy_serve_runs_the_api_server():
    """`fastdeploy serve ...` serves the same API (ready, the model listed) and exits 0 on SIGTERM."""
    server = launcher.start(module="fastdeploy.entrypoints.cli", subcommand="serve")
    try:
        models = httpx.get(server.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["fd-toy"]
    finally:
        status = launcher.stop(server)
    assert status == 0, server.log()[-3000:]
