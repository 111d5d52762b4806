"""P and D on two checkpoints that differ in one tensor are never paired (SERVICES §5, §6; docs/design.md
"Checkpoints: sizing and identity"): the checkpoint's identity hashes every byte, so their configuration hashes
differ and the router answers 503 naming `config_hash` instead of letting D decode from another model's KV. Round 5
sampled three 64 KiB windows per file, and this pair was served."""
from __future__ import annotations

import shutil
from pathlib import Path

import httpx

from tests.checkpoint_files import halve_a_tensor_between_samples, write_numpy_checkpoint
from tests.services import deployment as deploy


def test_p_and_d_on_checkpoints_differing_in_one_tensor_are_not_paired(tmp_path):
    """The same served name (both directories are called "tiny"), the same config.json and file sizes; one tensor
    halved in D's copy, mid-file: the router refuses the pair (503 naming config_hash)."""
    p_dir = write_numpy_checkpoint(tmp_path / "p" / "tiny", num_hidden_layers=10, tokenizer=True)
    d_dir = Path(shutil.copytree(p_dir, tmp_path / "d" / "tiny"))
    halve_a_tensor_between_samples(d_dir / "model.safetensors")
    deployment = deploy.Deployment(deploy.start_router("--splitwise"))
    try:
        deployment.add("prefill", "--splitwise-role", "prefill", model=str(p_dir))
        deployment.add("decode", "--splitwise-role", "decode", model=str(d_dir))
        deployment.await_ready()
        answer = httpx.post(deployment.router.url + "/v1/completions",
                            json={"model": "tiny", "prompt": "hello", "max_tokens": 2}, timeout=60)
        assert answer.status_code == 503 and "config_hash" in answer.json()["error"]["message"], answer.text
    finally:
        deployment.stop()
