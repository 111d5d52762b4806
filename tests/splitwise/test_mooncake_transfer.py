"""The one-sided KV flow over the Mooncake transfer engine between two processes on 127.0.0.1 (SERVICES §7,
PD_MTP_FLOW §3, §5.2 step 1): D reserves with the destination of its blocks, P writes the prompt's KV straight into
them and sends only the placed hand-off's header over ZeroMQ, D verifies the tag over its own blocks; a byte changed
in a placed block fails the verification."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import blake3
import numpy as np
import pytest

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.splitwise import Deadline, HandoffMessage, HandoffSamplingParams, MonotonicClock
from fastdeploy.splitwise.mooncake import (
    Destination,
    MooncakeEngine,
    MooncakeError,
    MooncakeKVTransfer,
    mooncake_unavailable_reason,
    rdma_devices,
    runs,
)
from fastdeploy.splitwise.zmq_transport import ZmqTransport
from fastdeploy.worker.kv_transfer import PromptKVPort

from .mooncake_layout import BLOCK_SIZE, CONFIG_HASH, LAYER_TAILS, NUM_BLOCKS, NUM_TOKENS, P_BLOCKS

REPO = Path(__file__).resolve().parents[2]
CLOCK = MonotonicClock()
WAIT_S = 30.0   # upper bound of each wait; never asserted on

UNAVAILABLE = mooncake_unavailable_reason()
needs_mooncake = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))


def _prefill_side(secret: bytes | None, staging_tokens: int = 0):
    port = PromptKVPort(KVCache(NUM_BLOCKS, BLOCK_SIZE, LAYER_TAILS), num_target_layers=2)
    rng = np.random.default_rng(7)
    for i in range(len(LAYER_TAILS)):
        view = port.kv.host_view(i)
        view[...] = rng.standard_normal(view.shape).astype(np.float32)
    transfer = MooncakeKVTransfer.start(port, "tcp", staging_tokens=staging_tokens)
    return port, transfer, ZmqTransport(listen="127.0.0.1:0", secret=secret)


def _run_pair(tmp_path, *d_args: str, secret: bytes | None = None,
              staging_tokens: int = 0) -> tuple[dict, str, HandoffMessage]:
    """P here, D in a child process: one placed hand-off; returns D's summary, P's KV digest and P's message."""
    port, transfer, transport = _prefill_side(secret, staging_tokens)
    log = open(tmp_path / "d.log", "w")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["--prefill-addr", transport.address, *d_args] + (["--secret", secret.decode()] if secret else [])
    proc = subprocess.Popen([sys.executable, "-m", "tests.splitwise.mooncake_peer", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        reservation = transport.poll_reservation_with_data(Deadline.after(CLOCK, WAIT_S))
        assert reservation is not None and reservation.request_id == "r0", (tmp_path / "d.log").read_text()
        destination = Destination.parse(reservation.data)
        message = HandoffMessage.create_placed(
            request_id="r0", prompt_token_ids=list(range(1, NUM_TOKENS + 1)),
            sampling=HandoffSamplingParams(max_tokens=8), t0=5, draft_token_ids=[5, 6],
            placed_kv=port.placed_kv(NUM_TOKENS), kv_chunks=transfer.write_to(destination, P_BLOCKS, NUM_TOKENS),
            config_hash=CONFIG_HASH, key=transport.handoff_key)
        frames = message.encode_frames()
        assert len(frames) == 1, "a placed hand-off is its header alone"
        assert transfer.staged_writes() == 0, "the staging slot is free once the write landed"
        assert staging_tokens == 0 or transfer.staging.in_place_writes == 0, "written from the staging slot"
        transport.send("r0", frames)
        assert transport.poll_ack(Deadline.after(CLOCK, WAIT_S)) == "r0"
        out, _ = proc.communicate(timeout=WAIT_S)
        assert proc.returncode == 0, (tmp_path / "d.log").read_text()
        digest = blake3.blake3()
        for chunk in port.prompt_kv_chunks(P_BLOCKS, NUM_TOKENS):
            digest.update(chunk)
        return json.loads(out.strip().splitlines()[-1]), digest.hexdigest(), message
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        log.close()
        transport.close()
        transfer.close()


@needs_mooncake
@pytest.mark.parametrize("secret, staging_tokens", [(None, 0), (b"s3cret", 0), (b"s3cret", NUM_TOKENS + 3)],
                         ids=["unkeyed", "keyed", "keyed-staged"])
def test_p_writes_into_d_blocks_and_d_verifies_them_in_place(tmp_path, secret, staging_tokens):
    """The one-sided flow: D's blocks hold exactly P's positions 0..L−1 of every layer after the write (from P's
    blocks, or from P's staging slot), the hand-off crossing ZeroMQ is its header alone, and D's tag over its own
    blocks matches P's (Insert)."""
    summary, p_digest, message = _run_pair(tmp_path, secret=secret, staging_tokens=staging_tokens)
    assert summary["verdict"] == "Insert" and summary["inline"] is False, summary
    assert summary["kv_digest"] == p_digest
    assert message.keyed is (secret is not None)


@needs_mooncake
def test_a_byte_flipped_in_a_placed_block_fails_verification(tmp_path):
    """PD_MTP_FLOW §5.2 step 1 for placed KV: one byte of D's block changed after P's write is a Reject naming the
    integrity tag; nothing is inserted."""
    summary, _, _ = _run_pair(tmp_path, "--flip", secret=b"s3cret")
    assert summary["verdict"] == "Reject" and "integrity tag" in summary["error"], summary


@needs_mooncake
def test_write_to_a_peer_that_is_gone_fails_with_one_line(tmp_path):
    """A write to a session nobody serves fails with MooncakeError, not a hang (SERVICES §6: D killed during the
    write)."""
    port, transfer, transport = _prefill_side(None, staging_tokens=NUM_TOKENS)
    try:
        regions = port.block_regions()
        gone = Destination("127.0.0.1:1", tuple(P_BLOCKS), tuple(regions))
        with pytest.raises(MooncakeError, match="127.0.0.1:1"):
            list(transfer.write_to(gone, P_BLOCKS, NUM_TOKENS))
        assert transfer.staged_writes() == 0, "a failed staged write gives its slot back"
    finally:
        transport.close()
        transfer.close()


@needs_mooncake
def test_reservation_data_is_validated_naming_the_field():
    """P checks D's destinations against its own layout before writing anything."""
    with pytest.raises(ValueError, match="'mooncake'"):
        Destination.parse({"other": 1})
    with pytest.raises(ValueError, match="'mooncake.session'"):
        Destination.parse({"mooncake": {"session": "nowhere", "block_ids": [1], "layers": [[0, 96]]}})
    with pytest.raises(ValueError, match="'mooncake.block_ids'"):
        Destination.parse({"mooncake": {"session": "h:1", "block_ids": [-1], "layers": [[0, 96]]}})
    port = PromptKVPort(KVCache(NUM_BLOCKS, BLOCK_SIZE, LAYER_TAILS), num_target_layers=2)
    transfer = MooncakeKVTransfer.start(port, "tcp")
    try:
        wrong = Destination("127.0.0.1:1", (1, 2, 3), ((0, 96),) * 2)
        with pytest.raises(ValueError, match="2 layers"):
            list(transfer.write_to(wrong, P_BLOCKS, NUM_TOKENS))
    finally:
        transfer.close()


@needs_mooncake
def test_engine_start_failure_is_one_clear_line():
    """SERVICES §6 (transfer-engine start failure): an RDMA device that does not exist, or a host name that does not
    resolve, stops the start with one line naming it."""
    with pytest.raises(MooncakeError, match="RDMA device 'fd-no-such-nic' not found"):
        MooncakeEngine("rdma", "fd-no-such-nic")
    with pytest.raises(MooncakeError, match="does not resolve"):
        MooncakeEngine("tcp", hostname="fd-no-such-host.invalid")
    with pytest.raises(ValueError, match="'protocol'"):
        MooncakeEngine("udp")


@pytest.mark.skipif(not rdma_devices(), reason="mooncake-rdma needs an RDMA NIC; this machine has none "
                                               "(/sys/class/infiniband is empty)")
@needs_mooncake
def test_rdma_engine_starts_on_the_first_rdma_device():
    """mooncake-rdma is the same code with protocol "rdma" and a device name: the engine starts on this machine's
    first RDMA device and registers a KV cache."""
    port = PromptKVPort(KVCache(NUM_BLOCKS, BLOCK_SIZE, LAYER_TAILS), num_target_layers=2)
    transfer = MooncakeKVTransfer.start(port, "rdma", rdma_devices()[0])
    try:
        assert transfer.engine.session_address.startswith("127.0.0.1:")
    finally:
        transfer.close()


def test_writes_consecutive_on_both_sides_merge_into_one():
    """Block writes whose source and destination both continue the previous write's become one write; a gap on
    either side starts a new one."""
    writes = [(100, 900, 10), (110, 910, 10), (120, 950, 10), (130, 960, 4), (200, 964, 10)]
    assert runs(writes) == [(100, 900, 20), (120, 950, 14), (200, 964, 10)]
    assert runs([]) == []
