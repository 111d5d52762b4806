"""README "Serve your model", the MoE + MTP launch: `fastdeploy serve --pd --model DIR --speculative-config
'{"method": "mtp", "num_speculative_tokens": 1, "model": "DIR/mtp"}'` on a tiny ERNIE-4.5 MoE checkpoint in the
Paddle layout whose MTP weights live in their own directory, as FastDeploy's releases keep them. P and D are real
processes behind the router; the answer is the single instance's without speculation. MTP asked without the MTP
directory is refused at start."""
from __future__ import annotations

import json
import signal

import httpx
import pytest

from tests.checkpoint_files import reference_missing, write_ernie4_5_moe_checkpoint
from tests.services import launcher

pytestmark = pytest.mark.skipif(reference_missing() is not None, reason=str(reference_missing()))
NAME = "ERNIE-4.5-moe-tiny-test"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ckpt") / NAME
    write_ernie4_5_moe_checkpoint(directory, layout="paddle", seed=4, mtp="separate")
    return directory


def test_serve_pd_with_the_mtp_directory_answers_the_single_instance_text(checkpoint, tmp_path):
    body = {"model": NAME, "prompt": "hello world", "max_tokens": 24, "temperature": 0}
    with launcher.serving("--max-num-seqs", "2", model=str(checkpoint), log_dir=tmp_path) as single:
        want = httpx.post(f"{single.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 1, "model": str(checkpoint / "mtp")})
    pd = launcher.start("--pd", "--max-num-seqs", "2", "--speculative-config", spec, model=str(checkpoint),
                        module="fastdeploy.entrypoints.cli", subcommand="serve", wait_ready=False, log_dir=tmp_path)
    try:
        pd.wait_until(lambda s: "ready: PD deployment" in s.log(), "the ready line", launcher.START_TIMEOUT_S)
        got = httpx.post(f"{pd.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
        assert (got["text"], got["finish_reason"]) == (want["text"], want["finish_reason"])
        assert want["text"]
    finally:
        launcher.stop(pd, signal.SIGINT)
        print(f"---- fastdeploy serve --pd log ----\n{pd.log()[-6000:]}")


def test_mtp_without_the_mtp_directory_is_refused_at_start(checkpoint, tmp_path):
    """Checked before the engine core starts: one line and exit status 2, as every bad launch."""
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 1})
    server = launcher.start("--speculative-config", spec, model=str(checkpoint), wait_ready=False, log_dir=tmp_path)
    try:
        assert server.process.wait(60) == 2
    finally:
        launcher.stop(server)
    lines = [line for line in server.log().splitlines() if line.strip()]
    assert len(lines) == 1 and "--speculative-config" in lines[0] and "no MTP weights" in lines[0], lines
    assert str(checkpoint) in lines[0]
