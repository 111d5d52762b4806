"""Bad checkpoints are refused at start with one line naming the directory and the file, field or tensor
(checkpoint.py, models/decoder_lm.py, FDConfig, build_engine); the configuration a checkpoint implies (max_model_len,
KV blocks, kv_identity). NumPy-written checkpoints: no torch needed."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.checkpoint_files import read_tensors, to_paddle_layout, write_numpy_checkpoint, write_tensors

from fastdeploy import LLM
from fastdeploy.config import FDConfig, SchedulerConfig, decode_lookahead
from fastdeploy.model_executor.models import get_model
from fastdeploy.model_executor.models.checkpoint import Checkpoint, read_checkpoint_config


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return write_numpy_checkpoint(tmp_path_factory.mktemp("ckpt") / "ernie", tokenizer=True)


@pytest.fixture
def ckpt(good, tmp_path) -> Path:
    """A fresh copy of the good checkpoint to break."""
    return Path(shutil.copytree(good, tmp_path / "broken"))


def _edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config))


def _edit_tensors(directory: Path, edit) -> None:
    tensors = read_tensors(directory)
    edit(tensors)
    (directory / "model.safetensors").unlink()
    write_tensors(directory, tensors, sharded=False)


def _refused(directory: Path, *fragments: str, **engine) -> str:
    with pytest.raises(ValueError) as info:
        LLM(model=str(directory), **engine)
    message = str(info.value)
    assert "\n" not in message and str(directory.name) in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_the_good_checkpoint_loads(good):
    model = get_model(str(good))
    assert (model.num_target_layers, model.num_mtp_layers, model.eos_token_ids) == (2, 0, (2,))
    assert model.kv_layer_tails() == [(2, 2, 16)] * 2


def test_config_json_missing(ckpt):
    (ckpt / "config.json").unlink()
    _refused(ckpt, "config.json is missing")


@pytest.mark.parametrize("change", [dict(dtype="float32"), dict(torch_dtype=None), dict(torch_dtype=None, dtype="float32")])
def test_the_tensors_decide_the_layout_whatever_the_dtype_key(ckpt, change):
    """transformers >= 4.56 writes `dtype` (not `torch_dtype`) for the torch layout: the non-square projections'
    orientation decides, and the checkpoint loads."""
    _edit_config(ckpt, **change)
    assert read_checkpoint_config(ckpt).layout == "torch"
    get_model(str(ckpt))


@pytest.mark.parametrize("change, fragment", [
    (dict(dtype="float32"), "only one of 'torch_dtype'"),
    (dict(torch_dtype=None), "unknown model format"),
])
def test_the_key_decides_only_where_every_projection_is_square(tmp_path, change, fragment):
    square = write_numpy_checkpoint(tmp_path / "square", intermediate_size=64, num_attention_heads=4, head_dim=16)
    assert read_checkpoint_config(square).layout == "torch"
    _edit_config(square, **change)
    _refused(square, fragment)


def test_layout_detection(good, tmp_path):
    assert read_checkpoint_config(good).layout == "torch"
    paddle = tmp_path / "p"
    to_paddle_layout(good, paddle)
    _edit_config(paddle, dtype="bfloat16", torch_dtype="float32")   # a wrong key: the fused tensors decide
    assert read_checkpoint_config(paddle).layout == "paddle"


def test_no_weights(ckpt):
    (ckpt / "model.safetensors").unlink()
    _refused(ckpt, "no weights")


def test_truncated_weights(ckpt):
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[:len(data) // 2])
    _refused(ckpt, "model.safetensors is not a readable safetensors file")


def test_missing_shard(ckpt):
    tensors = read_tensors(ckpt)
    (ckpt / "model.safetensors").unlink()
    write_tensors(ckpt, tensors, sharded=True)
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    _refused(ckpt, "model-00002-of-00002.safetensors (named by model.safetensors.index.json) is missing")


def test_tensor_missing(ckpt):
    _edit_tensors(ckpt, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    _refused(ckpt, "tensor 'model.layers.1.mlp.down_proj.weight' is missing")


def test_tensor_of_the_wrong_shape(ckpt):
    def edit(t):
        t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 64), np.float32)
    _edit_tensors(ckpt, edit)
    _refused(ckpt, "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [8, 64]", "[32, 64]")


def test_unknown_tensor(ckpt):
    def edit(t):
        t["model.layers.0.self_attn.extra_proj.weight"] = np.zeros((8, 8), np.float32)
    _edit_tensors(ckpt, edit)
    _refused(ckpt, "tensor 'model.layers.0.self_attn.extra_proj.weight' is not a weight of Ernie4_5ForCausalLM "
                   "as config.json describes it")


def test_both_prefixes_for_one_tensor(ckpt):
    def edit(t):
        t["ernie.norm.weight"] = t["model.norm.weight"]
    _edit_tensors(ckpt, edit)
    _refused(ckpt, "tensor 'model.norm.weight' and 'ernie.norm.weight' name the same weight")


@pytest.mark.parametrize("change, fragment", [
    (dict(num_hidden_layers=None), "field 'num_hidden_layers' is missing"),
    (dict(hidden_size="64"), "field 'hidden_size' must be int"),
    (dict(num_hidden_layers=1), "'num_hidden_layers' (1) does not match the weights (layers 0..1)"),
    (dict(num_hidden_layers=3), "'num_hidden_layers' (3) does not match the weights (layers 0..1)"),
    (dict(vocab_size=500), "tensor 'model.embed_tokens.weight' has shape"),
    (dict(num_key_value_heads=3), "'num_attention_heads' (4) must be a multiple of 'num_key_value_heads' (3)"),
    (dict(architectures=["GPT2LMHeadModel"]), "architecture 'GPT2LMHeadModel'"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0}), "field 'rope_scaling'"),
    (dict(use_bias=True), "field 'use_bias' true is not supported"),
])
def test_config_fields(ckpt, change, fragment):
    _edit_config(ckpt, **change)
    message = _refused(ckpt, fragment)
    if "architectures" in change:
        assert "supported: Ernie4_5ForCausalLM, Ernie4_5_MoeForCausalLM, Qwen3ForCausalLM, Qwen2ForCausalLM, " \
               "LlamaForCausalLM" in message


def test_tied_head_must_be_the_embedding(ckpt):
    def edit(t):
        t["lm_head.weight"] = t["model.embed_tokens.weight"] + 1
    _edit_tensors(ckpt, edit)
    _refused(ckpt, "'tie_word_embeddings' is true but tensor 'lm_head.weight' differs")


def test_eos_ids_from_generation_config_then_config(ckpt):
    (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    assert read_checkpoint_config(ckpt).eos_token_ids == (2, 5)
    (ckpt / "generation_config.json").unlink()
    assert read_checkpoint_config(ckpt).eos_token_ids == (2,)
    _edit_config(ckpt, eos_token_id=None)
    _refused(ckpt, "no EOS token")


def test_tokenizer_missing(ckpt):
    (ckpt / "tokenizer.model").unlink()
    with pytest.raises(ValueError, match="broken"):
        get_model(str(ckpt))


def test_mtp_asked_of_a_checkpoint_without_mtp(good):
    _refused(good, "has no MTP weights", "num_speculative_tokens 1",
             speculative_config={"method": "mtp", "num_speculative_tokens": 1})


def test_max_model_len(good):
    assert FDConfig(model=str(good)).scheduler.max_model_len == 512    # the config's max_position_embeddings
    assert FDConfig(model=str(good), scheduler=SchedulerConfig(max_model_len=100)).scheduler.max_model_len == 100
    assert FDConfig(model="fd-tiny").scheduler.max_model_len == 512    # the embedded default, unchanged
    with pytest.raises(ValueError, match=r"'max_model_len' \(513\) is above the checkpoint's "
                                         r"max_position_embeddings \(512"):
        FDConfig(model=str(good), scheduler=SchedulerConfig(max_model_len=513))


def test_kv_budget(good):
    from fastdeploy.config import CacheConfig
    # 2 layers x K,V x 2 heads x 16 x 4 bytes = 512 B a token, 8 KiB a block of 16
    config = FDConfig(model=str(good), cache=CacheConfig(kv_cache_memory_bytes=64 * 8192))
    assert config.cache.num_kv_blocks == 64                       # the budget, under 8 slots x 33 blocks
    assert config.scheduler.max_model_len == 512                  # one request still fits
    small = FDConfig(model=str(good), cache=CacheConfig(kv_cache_memory_bytes=20 * 8192))
    # lowered to what one request can hold, with the decode lookahead past max_model_len (config.py)
    assert small.scheduler.max_model_len == 20 * 16 - decode_lookahead(0)
    with pytest.raises(ValueError, match=r"the KV cache does not fit: one request at max_model_len 512 needs 33 "
                                         r"blocks of 16 tokens \(0.3 MiB\), --kv-cache-memory-bytes 160.0 KiB holds "
                                         r"20; lower --max-model-len or give --kv-cache-memory-bytes 270336 or more"):
        FDConfig(model=str(good), scheduler=SchedulerConfig(max_model_len=512),
                 cache=CacheConfig(kv_cache_memory_bytes=20 * 8192))
    with pytest.raises(ValueError, match="--num-kv-blocks 10 holds 10; lower --max-model-len or give "
                                         "--num-kv-blocks 33 or more"):
        FDConfig(model=str(good), scheduler=SchedulerConfig(max_model_len=512), cache=CacheConfig(num_kv_blocks=10))
    given = FDConfig(model=str(good), cache=CacheConfig(num_kv_blocks=10))   # --num-kv-blocks is the budget then
    assert (given.cache.num_kv_blocks, given.scheduler.max_model_len) == (10, 10 * 16 - decode_lookahead(0))


def test_kv_identity_names_the_checkpoint_by_content(good, tmp_path):
    """Copies of one checkpoint at two paths (a P and a D on two hosts) share the identity; a change to the config
    or to the weights does not (every byte is hashed, so a same-shape fine-tune differs too)."""
    same = FDConfig(model=str(good)).kv_identity
    copy = Path(shutil.copytree(good, tmp_path / "copy"))
    assert FDConfig(model=str(copy)).kv_identity == same and str(copy) not in same.decode()
    config_edit = Path(shutil.copytree(good, tmp_path / "config_edit"))
    _edit_config(config_edit, rms_norm_eps=1e-6)
    assert FDConfig(model=str(config_edit)).kv_identity != same
    weights_edit = Path(shutil.copytree(good, tmp_path / "weights_edit"))
    _edit_tensors(weights_edit, lambda t: t.update({n: v * np.float32(1.01) for n, v in t.items()}))  # a fine-tune
    assert FDConfig(model=str(weights_edit)).kv_identity != same
    assert FDConfig(model=str(good), dtype="float64").kv_identity != same
    assert FDConfig(model="fd-tiny").kv_identity.startswith(b"fd-tiny|")   # embedded names unchanged


def _raw_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """A safetensors file written by hand (8-byte header length, JSON header, data), so that BF16 needs neither
    torch nor a NumPy bfloat16."""
    header, data, offset = {}, b"", 0
    for name, (dtype, array) in tensors.items():
        raw = array.tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        data, offset = data + raw, offset + len(raw)
    blob = json.dumps(header).encode()
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_bfloat16_and_float16_weights_are_widened_exactly(ckpt, dtype):
    values = np.array([[1.0, -2.5], [0.15625, 3.0e-3], [-1e30, 7.0]], np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)       # bfloat16 = the top half of a float32
    exact = (bf16.astype(np.uint32) << 16).view(np.float32)
    (ckpt / "model.safetensors").rename(ckpt / "model-00001-of-00002.safetensors")
    _raw_safetensors(ckpt / "model-00002-of-00002.safetensors",
                     {"b": ("BF16", bf16), "h": ("F16", values[:2].astype(np.float16))})
    checkpoint = Checkpoint(ckpt)   # no model.safetensors, no index: every *.safetensors
    assert checkpoint.has("model.norm.weight") and checkpoint.shape("b") == (3, 2)
    np.testing.assert_array_equal(checkpoint.tensor("b", dtype), exact.astype(dtype))
    np.testing.assert_array_equal(checkpoint.tensor("h", dtype), values[:2].astype(np.float16).astype(dtype))
    assert checkpoint.tensor("model.norm.weight", dtype).dtype == np.dtype(dtype)
    with pytest.raises(RuntimeError, match="read twice"):
        checkpoint.tensor("b", dtype)


def test_config_reading_needs_no_paddle(good):
    """read_checkpoint_config is what the API server calls: it must not import Paddle (or torch)."""
    code = ("import sys; from fastdeploy.model_executor.models.checkpoint import read_checkpoint_config; "
            f"c = read_checkpoint_config({str(good)!r}); "
            "assert 'paddle' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules); "
            "print(c.architecture, c.layout, c.max_position_embeddings, c.has_mtp_weights)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Ernie4_5ForCausalLM", "torch", "512", "False"]


@pytest.mark.parametrize("field, value, fragment", [
    ("intermediate_size", 96 * 10_000, "mlp.down_proj.weight' has shape [64, 96]"),
    ("num_hidden_layers", 2_000, "'num_hidden_layers' (2000) does not match the weights (layers 0..1)"),
    ("vocab_size", 384 * 10_000, "embed_tokens.weight' has shape"),
])
def test_an_inflated_config_is_refused_from_the_headers_before_any_allocation(ckpt, field, value, fragment):
    """One line naming the tensor or field, in a process whose peak memory stays far below what the config's sizes
    would allocate (~750 MB and more), not a MemoryError or the OOM killer."""
    _edit_config(ckpt, **{field: value})
    # VmHWM, the peak of this process's own memory: ru_maxrss also keeps the parent's resident size from before
    # the exec (Linux records the old address space's peak at execve), so it reads the pytest worker's size
    script = ("import re, sys\nfrom fastdeploy.model_executor.models import get_model\n"
              "try:\n    get_model(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n"
              "status = open('/proc/self/status').read()\n"
              "print(int(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1)) // 1024)")
    done = subprocess.run([sys.executable, "-c", script, str(ckpt)], capture_output=True, text=True, timeout=120)
    message, peak_mib = done.stdout.strip().splitlines()[-2], int(done.stdout.strip().splitlines()[-1])
    assert fragment in message, done.stdout + done.stderr[-2000:]
    assert peak_mib < 600, peak_mib


@pytest.mark.parametrize("scaling", [{"rope_type": "default"}, {"type": "default"}])
def test_a_default_rope_scaling_means_plain_rope(ckpt, good, scaling):
    _edit_config(ckpt, rope_scaling=scaling)
    prompt = [[3, 4, 5, 6]]
    params = dict(max_num_seqs=1)
    from fastdeploy import SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert LLM(model=str(ckpt), **params).generate(prompt, sp, use_tqdm=False)[0].outputs.token_ids == \
        LLM(model=str(good), **params).generate(prompt, sp, use_tqdm=False)[0].outputs.token_ids


def test_stored_rotary_inv_freq_buffers_are_passed_over(ckpt):
    """Older conversions store RoPE's inv_freq per layer; transformers recomputes it and so does the engine."""
    _edit_tensors(ckpt, lambda t: t.update({f"model.layers.{i}.self_attn.rotary_emb.inv_freq":
                                            np.ones(8, np.float32) for i in range(2)}))
    get_model(str(ckpt))
