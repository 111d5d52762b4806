"""ERNIE-4.5 MoE + MTP against the independent oracle (docs/testing.md "Checkpoint oracle"): tiny random checkpoints
written by transformers (torch layout) and rewritten as FastDeploy's Paddle layout, the target's greedy tokens and
logprobs against transformers' `Ernie4_5_MoeForCausalLM`, the MTP module's logits against the torch MTP reference
(tests/reference/ernie4_5_moe_torch.py, itself checked against transformers' own MtpModel), and the start-up
refusals. The reference runs in subprocesses; this process never imports torch."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fastdeploy.config import SpeculativeConfig
from fastdeploy.model_executor.models import get_model
from fastdeploy.model_executor.models.checkpoint import CheckpointError

from tests import checkpoint_files as cf
from tests.models.paged_runner import packed_batch

pytestmark = pytest.mark.skipif(cf.reference_missing() is not None, reason=str(cf.reference_missing()))

PROMPTS = [[5, 6, 7], [100, 20, 30, 40], [250, 3, 77, 9, 12], [300, 301], [17] * 6, [42, 8, 99, 140, 66, 7, 1],
           [200, 150, 100, 50], [11, 22, 33, 44, 55, 66, 77, 88, 99]]
NEW_TOKENS = 32
# float64 on both sides, but transformers computes the rotary angles in float32 and both route in float32 (as
# transformers forces it): the differences that leaves are ~4e-7 on logprobs of -3..-5 (observed)
LOGPROB_ATOL = 1e-5
MTP_ATOL = 1e-5
MTP1 = SpeculativeConfig("mtp", 1)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> dict:
    """One torch-layout checkpoint (transformers-written, MTP inline) and its Paddle-layout rewrite."""
    root = tmp_path_factory.mktemp("ernie_moe")
    report = cf.write_ernie4_5_moe_checkpoint(root / "paddle", layout="paddle", seed=3)
    return {"torch": Path(report["torch_directory"]), "paddle": root / "paddle", "report": report}


@pytest.fixture(scope="module")
def oracle(ckpt) -> dict:
    return cf.moe_reference("generate", ckpt["torch"], prompts=PROMPTS, max_new_tokens=NEW_TOKENS)


def greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[float], np.ndarray]:
    """Prefill, then one token per pass; tokens, their log-probabilities and the full sequence's hidden states."""
    kv = model.new_kv_cache(16, 16)
    table = np.arange(16, dtype=np.int32)[None]
    logits, hidden = model.forward(packed_batch([prompt], [0], table), kv)
    tokens, logprobs = [], []
    for _ in range(steps):
        row = logits.numpy()[-1].astype(np.float64)
        lp = row - row.max() - np.log(np.exp(row - row.max()).sum())
        tokens.append(int(row.argmax()))
        logprobs.append(float(lp[tokens[-1]]))
        logits, hidden = model.forward(packed_batch([[tokens[-1]]], [len(prompt) + len(tokens) - 1], table), kv)
    return tokens, logprobs


@pytest.mark.parametrize("layout", ["torch", "paddle"])
def test_target_greedy_tokens_and_logprobs_equal_transformers(ckpt, oracle, layout):
    model = get_model(str(ckpt[layout]), dtype="float64")
    assert type(model).__name__ == "Ernie4_5_MoeForCausalLM" and model.num_mtp_layers == 0
    assert sorted(model.moe_layer_ids) == [1, 2, 3]
    distinct = set()
    for prompt, want, want_lp in zip(PROMPTS, oracle["tokens"], oracle["logprobs"]):
        tokens, logprobs = greedy(model, prompt, NEW_TOKENS)
        assert tokens == want, f"prompt {prompt}"
        np.testing.assert_allclose(logprobs, want_lp, rtol=0, atol=LOGPROB_ATOL)
        distinct.update(tokens)
    assert len(distinct) >= 12   # the text is not one repeated token, so the comparison means something


def _mtp_logits(model, sequence: list[int]) -> np.ndarray:
    """The MTP module at every position p of `sequence` (token at p + 1, target hidden at p), through the cache."""
    kv = model.new_kv_cache(16, 16)
    table = np.arange(16, dtype=np.int32)[None]
    _, hidden = model.forward(packed_batch([sequence], [0], table), kv)
    logits, _ = model.mtp_forward(packed_batch([sequence[1:]], [0], table), hidden[:-1], kv)
    return logits.numpy()


@pytest.fixture(scope="module")
def mtp_oracle(ckpt, oracle) -> dict:
    sequences = [p + t for p, t in zip(PROMPTS[:3], oracle["tokens"][:3])]
    return {"sequences": sequences, **cf.moe_reference("mtp_logits", ckpt["torch"], sequences=sequences)}


@pytest.mark.parametrize("layout", ["torch", "paddle"])
def test_mtp_logits_equal_the_torch_reference(ckpt, mtp_oracle, layout):
    assert mtp_oracle["native_max_diff"] is None or mtp_oracle["native_max_diff"] < 1e-5
    model = get_model(str(ckpt[layout]), dtype="float64", speculative=MTP1)
    assert model.num_mtp_layers == 1 and len(model.kv_layer_tails()) == model.num_target_layers + 1
    for sequence, want in zip(mtp_oracle["sequences"], mtp_oracle["logits"]):
        np.testing.assert_allclose(_mtp_logits(model, sequence), np.asarray(want), rtol=0, atol=MTP_ATOL)


def test_the_fitted_mtp_agrees_often_but_not_always(ckpt, mtp_oracle):
    """The fixture's MTP drafts the target's next-but-one greedy token on some positions, not all (so the
    losslessness tests see drafts accepted and rejected)."""
    agree = total = 0
    for sequence, logits in zip(mtp_oracle["sequences"], mtp_oracle["logits"]):
        drafts = np.asarray(logits).argmax(axis=1)[:-1]
        agree += int((drafts == np.asarray(sequence[2:])).sum())
        total += len(sequence) - 2
    assert 0.15 < agree / total < 0.95, agree / total


def _split_mtp(source: Path, target: Path) -> Path:
    """A copy of checkpoint `source` whose MTP tensors live in `target / "mtp"` (the --speculative-config "model"
    form), there with a copy of the shared embedding (not read: the target's is used); returns the MTP directory."""
    from safetensors.numpy import load_file, save_file
    shutil.copytree(source, target)
    tensors = load_file(str(target / "model.safetensors"))
    mtp = {n: t for n, t in tensors.items() if ".mtp_" in n}
    embed = next(n for n in tensors if n.endswith("embed_tokens.weight"))
    save_file({n: t for n, t in tensors.items() if n not in mtp}, str(target / "model.safetensors"),
              metadata={"format": "np"})
    (target / "mtp").mkdir()
    save_file({**mtp, embed: tensors[embed]}, str(target / "mtp" / "model.safetensors"), metadata={"format": "np"})
    shutil.copy(target / "config.json", target / "mtp" / "config.json")
    return target / "mtp"


def test_mtp_weights_from_their_own_directory(ckpt, mtp_oracle, tmp_path):
    mtp_dir = _split_mtp(ckpt["paddle"], tmp_path / "split")
    model = get_model(str(tmp_path / "split"), dtype="float64",
                      speculative=SpeculativeConfig("mtp", 1, model=str(mtp_dir)))
    sequence, want = mtp_oracle["sequences"][0], mtp_oracle["logits"][0]
    np.testing.assert_allclose(_mtp_logits(model, sequence), np.asarray(want), rtol=0, atol=MTP_ATOL)
    with pytest.raises(CheckpointError, match=r"split'.*no MTP weights.*--speculative-config"):
        get_model(str(tmp_path / "split"), speculative=MTP1)
    with pytest.raises(CheckpointError, match="no MTP weights"):
        get_model(str(tmp_path / "split"), speculative=SpeculativeConfig("mtp", 1, model=str(tmp_path / "split")))


def test_mtp_of_an_architecture_without_one_is_refused(ckpt, tmp_path):
    dense = tmp_path / "dense"
    shutil.copytree(ckpt["torch"], dense)
    config = json.loads((dense / "config.json").read_text())
    config["architectures"] = ["Ernie4_5ForCausalLM"]
    (dense / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"dense'.*Ernie4_5ForCausalLM has no MTP weights \(the architecture "
                                              r"has no MTP module\).*supported for Ernie4_5_MoeForCausalLM"):
        get_model(str(dense), speculative=MTP1)


def test_bad_moe_fields_are_named(ckpt, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(ckpt["torch"], bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "moe_k": 9}))
    with pytest.raises(CheckpointError, match=r"'moe_k' \(9\) must be at most 'moe_num_experts' \(8\)"):
        get_model(str(bad))
    (bad / "config.json").write_text(json.dumps({**config, "moe_num_experts": [8, 8]}))
    with pytest.raises(CheckpointError, match="'moe_num_experts' is a list"):
        get_model(str(bad))


def test_speculative_model_is_checked_and_named_by_content(ckpt, tmp_path):
    """SpeculativeConfig.model (FastDeploy's --speculative-config "model"): only with method mtp, only for a
    checkpoint; its content digest (not its path) is in the KV identity and the PD configuration hash."""
    from fastdeploy.config import FDConfig
    from fastdeploy.engine.connector.base import instance_config_hash
    mtp_dir = _split_mtp(ckpt["paddle"], tmp_path / "split")
    shutil.copytree(mtp_dir, tmp_path / "elsewhere")
    spec = SpeculativeConfig.from_user({"method": "mtp", "num_speculative_tokens": 1, "model": str(mtp_dir)})
    assert spec.model == str(mtp_dir)
    with pytest.raises(ValueError, match="field 'model'"):
        SpeculativeConfig(None, 0, model=str(mtp_dir))
    with pytest.raises(ValueError, match="speculative.model"):
        FDConfig(model="fd-tiny", speculative=spec)
    here = FDConfig(model=str(tmp_path / "split"), speculative=spec)
    there = FDConfig(model=str(tmp_path / "split"),
                     speculative=SpeculativeConfig("mtp", 1, model=str(tmp_path / "elsewhere")))
    own = FDConfig(model=str(ckpt["paddle"]), speculative=MTP1)
    assert here.mtp_identity.startswith("checkpoint:") and b"|mtp=checkpoint:" in here.kv_identity
    assert here.kv_identity == there.kv_identity and own.mtp_identity == ""
    assert instance_config_hash(here, 384) == instance_config_hash(there, 384) != instance_config_hash(own, 384)
