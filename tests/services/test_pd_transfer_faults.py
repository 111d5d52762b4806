"""SERVICES §6's fault rows over each KV transport, against real router, P and D processes (fd-toy, MTP K = 1):
the ZeroMQ connector (the KV inside its messages) and the Mooncake transfer engine over TCP (the KV written
one-sided into D's blocks, only the header over ZeroMQ). Each fault is seen from the client's side (an error that
names the cause, never a hang) and in /metrics (nothing held afterwards). tests/services/test_pd_faults.py holds
the rows that do not depend on the transport; a peer still on wire format v1 is refused at the connector
(tests/splitwise/test_zmq_transport.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import openai
import pytest

from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from tests.services import deployment as deploy
from tests.services import launcher

K = 1
PROMPT = "On Monday, Judy"
TIMEOUT = ("--pd-timeout-secs", f"{3 * launcher.load_slowdown():g}")   # longer under load: good requests meet it too
TRANSPORTS = ["zmq", "mooncake-tcp"]
# Injected into D's processes (API server and engine core) through PYTHONPATH: the first request verified over
# D's own blocks sees one of their bytes flipped, as a write damaged on the way would leave it.
FLIP_ONE_BYTE = '''
from fastdeploy.splitwise import mooncake

_in_place, _flipped = mooncake.MooncakeKVTransfer.in_place, []


def _flipping(self, block_ids):
    read = _in_place(self, block_ids)

    def chunks(num_tokens):
        views = read(num_tokens)
        if not _flipped:
            _flipped.append(True)
            first = memoryview(views[0]).cast("B")
            first[0] ^= 0x01
        return views

    return chunks


mooncake.MooncakeKVTransfer.in_place = _flipping
'''


def transfer_flags(transport: str) -> tuple[str, ...]:
    if transport == "zmq":
        return ()
    reason = mooncake_unavailable_reason()
    if reason is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    return ("--cache-transfer-protocol", transport)


def ask_in_background(deployment: deploy.Deployment, result: dict, **options) -> threading.Thread:
    """One completion through the router in a thread; `result` gets the error's status and text."""
    def ask():
        with deployment.client() as client:
            try:
                result["answer"] = client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=8,
                                                             **options)
            except openai.APIError as error:
                result["status"] = getattr(error, "status_code", None)
                result["message"] = str(error)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    return thread


def holding(server: launcher.Server) -> bool:
    return launcher.nothing_held(server) is False


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_decode_killed_before_the_kv_moves_fails_the_request_and_prefill_frees(transport):
    """D is killed after it reserved and before P's KV reaches it (P is held stopped meanwhile): P's send or
    one-sided write fails, the client gets an error, and P holds nothing afterwards (its blocks come back at once
    or at its KV_TRANSFER deadline)."""
    flags = (*transfer_flags(transport), *TIMEOUT)
    deployment = deploy.pd_deployment(k=K, prefill_flags=flags, decode_flags=flags,
                                      router_flags=("--health-interval-secs", "2"))
    try:
        prefill, decode = deployment.instances["prefill"], deployment.instances["decode"]
        os.kill(prefill.engine_core_pid(), signal.SIGSTOP)
        result: dict = {}
        asker = ask_in_background(deployment, result)
        decode.wait_until(holding, "D holding its reservation")
        os.killpg(decode.process.pid, signal.SIGKILL)
        os.kill(prefill.engine_core_pid(), signal.SIGCONT)
        asker.join(timeout=60)
        assert "answer" not in result and result.get("message"), result
        deployment.instances.pop("decode")
        deployment.wait_nothing_held("prefill")
    finally:
        deployment.stop()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_prefill_killed_after_decode_reserved_fails_the_request_and_decode_frees(transport):
    """P is killed after D reserved (P stopped first, so it cannot hand off): the client gets an error naming P,
    and D holds nothing afterwards (over Mooncake, after the blocks P might still have written into are back)."""
    flags = (*transfer_flags(transport), *TIMEOUT)
    deployment = deploy.pd_deployment(k=K, prefill_flags=flags, decode_flags=flags,
                                      router_flags=("--health-interval-secs", "2"))
    try:
        prefill, decode = deployment.instances["prefill"], deployment.instances["decode"]
        os.killpg(prefill.process.pid, signal.SIGSTOP)
        result: dict = {}
        asker = ask_in_background(deployment, result)
        decode.wait_until(holding, "D holding its reservation")
        os.killpg(prefill.process.pid, signal.SIGKILL)
        asker.join(timeout=60)
        assert result.get("status") in (502, 503) and "prefill" in result["message"], result
        deployment.instances.pop("prefill")
        deployment.wait_nothing_held("decode")
    finally:
        deployment.stop()


def test_a_byte_flipped_in_a_written_block_fails_the_request_and_both_free(tmp_path):
    """Over Mooncake the KV lands in D's blocks before D checks it: a byte damaged there fails the hand-off's tag
    at D's receipt (PD_MTP_FLOW §5.2 step 1); the client gets the integrity error, both sides free everything,
    and the next request is served."""
    flags = transfer_flags("mooncake-tcp")
    (tmp_path / "sitecustomize.py").write_text(FLIP_ONE_BYTE)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH"))))}
    deployment = deploy.Deployment(deploy.start_router("--splitwise"))
    try:
        deployment.add("prefill", "--splitwise-role", "prefill", *deploy.spec_flags(K), *flags)
        deployment.add("decode", "--splitwise-role", "decode", *deploy.spec_flags(K), *flags, env=env)
        deployment.await_ready()
        with deployment.client() as client:
            with pytest.raises(openai.APIStatusError) as failed:
                client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=8)
            assert "integrity tag" in str(failed.value), failed.value
            deployment.wait_nothing_held()
            again = client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=8)
        assert again.choices[0].finish_reason in ("stop", "length")
        deployment.wait_nothing_held()
    finally:
        deployment.stop()


def test_mismatched_secrets_over_mooncake_never_connect(tmp_path):
    """P and D keyed differently: D's connection to P never completes its handshake, so no reservation reaches P
    and P writes nothing into D's blocks; the client gets an error naming the secret at D's reservation-ack
    deadline and both sides hold nothing."""
    flags = transfer_flags("mooncake-tcp")
    secrets = []
    for name in ("p", "d"):
        path = tmp_path / f"{name}.secret"
        path.write_text(f"secret-of-{name}")
        secrets.append(str(path))
    deployment = deploy.pd_deployment(k=K, prefill_flags=(*flags, "--pd-secret-file", secrets[0]),
                                      decode_flags=(*flags, "--pd-secret-file", secrets[1],
                                                    "--pd-reservation-ack-timeout-secs", "1"),
                                      router_flags=("--request-timeout-secs", "5"))
    try:
        with deployment.client() as client:
            with pytest.raises(openai.APIStatusError) as failed:
                client.completions.create(model="fd-toy", prompt=PROMPT, max_tokens=4)
        assert "the same PD secret" in str(failed.value), failed.value
        deployment.wait_nothing_held()
    finally:
        deployment.stop()


def test_a_transfer_engine_that_cannot_start_refuses_the_instance_with_one_line():
    """`mooncake-rdma` on a device this machine lacks: the API server exits 2 at once, one line naming it."""
    transfer_flags("mooncake-rdma")
    done = subprocess.run([sys.executable, "-m", "fastdeploy.entrypoints.openai.api_server", "--model", "fd-toy",
                           "--splitwise-role", "prefill", "--cache-transfer-protocol", "mooncake-rdma",
                           "--mooncake-device", "no-such-nic0"], capture_output=True, text=True, timeout=60,
                          cwd=launcher.REPO)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-nic0" in lines[0] and "RDMA device" in lines[0], done.stderr
