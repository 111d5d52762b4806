"""The KV cache sized from a memory budget (docs/design.md §3 "KV budget", docs/serving.md "Memory"): the figure's
source (flag, host share or default) in the config and the start line, a budget too small for one request
refused at start with one line, and a cache whose untouched pages are not resident."""
from __future__ import annotations

import subprocess
import sys

import pytest

from fastdeploy.config import CacheConfig, FDConfig, SchedulerConfig, estimated_weight_bytes
from fastdeploy.kv_budget import DEFAULT_KV_CACHE_BYTES, parse_bytes, resolve_budget, split_host_budget
from fastdeploy.model_executor.models.checkpoint import read_checkpoint_config
from tests.checkpoint_files import write_numpy_checkpoint

BLOCK_BYTES = 16 * 512   # the test checkpoint: 2 layers x K,V x 2 KV heads x 16 x 4 bytes = 512 B a token


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_numpy_checkpoint(tmp_path_factory.mktemp("ckpt") / "ernie", tokenizer=True)


@pytest.fixture(scope="module")
def long_context(tmp_path_factory):
    """The same shapes with a 64k context: every slot at max_model_len is 8 x 32 MiB, above a small budget."""
    return write_numpy_checkpoint(tmp_path_factory.mktemp("ckpt") / "long", tokenizer=True,
                                  max_position_embeddings=65536)


@pytest.mark.parametrize("text, value", [
    ("1073741824", 2 ** 30), ("1G", 2 ** 30), ("1GiB", 2 ** 30), ("1gb", 2 ** 30), ("512M", 2 ** 29),
    ("1.5G", 3 * 2 ** 29), ("64 KiB", 2 ** 16), (4096, 4096),
])
def test_sizes_are_read_in_binary_units(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1G", "0", "1X", "1.5.2G"])
def test_a_bad_size_names_the_flag(text):
    with pytest.raises(ValueError, match="--kv-cache-memory-bytes: "):
        parse_bytes(text)


def test_the_budget_comes_from_the_flag_then_the_host_share_then_the_default():
    """--kv-cache-memory-bytes wins; --gpu-memory-utilization is that share of the host's memory less the weights
    (FastDeploy: weights and KV share the fraction); neither: the fixed default space."""
    assert resolve_budget(5 * 2 ** 20, 0.5, 10, host_bytes=2 ** 34).bytes == 5 * 2 ** 20
    share = resolve_budget(None, 0.5, 2 ** 30, host_bytes=16 * 2 ** 30)
    assert share.bytes == 7 * 2 ** 30
    assert share.source == "--gpu-memory-utilization 0.5 of the host's 16.00 GiB less 1.00 GiB of weights"
    assert resolve_budget(None, None, 2 ** 30).bytes == DEFAULT_KV_CACHE_BYTES
    with pytest.raises(ValueError, match="leaves nothing for the KV cache after the weights"):
        resolve_budget(None, 0.05, 2 ** 30, host_bytes=16 * 2 ** 30)


def test_blocks_follow_from_the_budget_and_the_kv_dtype(long_context):
    """Blocks = budget // block bytes, and a block's bytes are the KV dtype's: float64 halves the blocks."""
    budget = 4 * 2 ** 20
    f32 = FDConfig(model=str(long_context), cache=CacheConfig(kv_cache_memory_bytes=budget))
    f64 = FDConfig(model=str(long_context), dtype="float64", cache=CacheConfig(kv_cache_memory_bytes=budget))
    assert f32.cache.num_kv_blocks == budget // BLOCK_BYTES == 512
    assert f64.cache.num_kv_blocks == budget // (2 * BLOCK_BYTES) == 256
    assert f32.cache.budget_source.startswith("--kv-cache-memory-bytes 4.0 MiB, 4.0 MiB used")
    assert f32.scheduler.max_model_len < 65536   # lowered to what one request can hold in the budget


def test_every_slot_at_max_model_len_caps_the_blocks(good):
    config = FDConfig(model=str(good), cache=CacheConfig(kv_cache_memory_bytes=2 ** 30))
    assert config.cache.num_kv_blocks == 8 * config.blocks_per_seq
    assert config.cache.budget_source.endswith("used (every slot at max_model_len)")
    assert FDConfig(model=str(good)).cache.budget_source.startswith("the default KV space 4.00 GiB")
    blocks = FDConfig(model=str(good), cache=CacheConfig(num_kv_blocks=40))
    assert (blocks.cache.num_kv_blocks, blocks.cache.budget_source) == (40, "--num-kv-blocks 40")



def test_a_role_copy_keeps_the_budget_its_blocks_came_from(good):
    """Before: `fastdeploy generate --pd` and LLM(splitwise=True) printed `from --num-kv-blocks 129` for P and D,
    a flag nobody gave, because the role copy re-derived the source from the blocks it inherited."""
    from fastdeploy.entrypoints.pd_builder import with_role
    config = FDConfig(model=str(good))
    for role in ("prefill", "decode"):
        copy = with_role(config, role)
        assert (copy.role, copy.cache.num_kv_blocks) == (role, config.cache.num_kv_blocks)
        assert copy.cache.budget_source == config.cache.budget_source
        assert copy.cache.budget_source.startswith("the default KV space 4.00 GiB")

def test_the_weight_estimate_counts_every_tensor_at_the_dtype(good):
    ckpt = read_checkpoint_config(good)
    params = sum(int(__import__("math").prod(t.shape)) for t in ckpt.tensors.values())
    assert estimated_weight_bytes(ckpt, "float32") == 4 * params
    assert estimated_weight_bytes(ckpt, "bfloat16") == 2 * params


def test_a_budget_too_small_for_one_request_is_refused_at_start_with_one_line(good, capsys):
    from fastdeploy.entrypoints.openai.serve_args import parse_args
    with pytest.raises(SystemExit) as exited:
        parse_args(["--model", str(good), "--max-model-len", "512", "--kv-cache-memory-bytes", "100K"])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and len(err.splitlines()) == 1, err
    assert ("the KV cache does not fit: one request at max_model_len 512 needs 33 blocks" in err
            and "--kv-cache-memory-bytes 100.0 KiB holds 12" in err), err


def test_split_host_budget_gives_each_instance_its_slots_share():
    """P holds the prompts in flight (its slots), D whole contexts (its slots, twice P's by default)."""
    assert split_host_budget(3 * 2 ** 30, 1, 8, 1, 16) == (2 ** 30, 2 * 2 ** 30)
    p, d = split_host_budget(4 * 2 ** 30, 2, 8, 4, 16)
    assert (p, d) == (4 * 2 ** 30 * 8 // 80, 4 * 2 ** 30 * 16 // 80)
    assert 2 * p + 4 * d <= 4 * 2 ** 30
    with pytest.raises(ValueError, match="argument 'num_decode' must be >= 1"):
        split_host_budget(2 ** 30, 1, 8, 0, 16)


# The resident-memory check runs in its own process: RSS there is the engine's alone.
_RSS_SCRIPT = """
import sys
from fastdeploy import LLM, SamplingParams

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

before = rss()
llm = LLM(model=sys.argv[1], max_num_seqs=16, kv_cache_memory_bytes=sys.argv[2])
llm.generate([[3, 4, 5, 6]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
kv = llm.config.cache.num_kv_blocks * llm.config.cache.block_size * 512
print(before, rss(), kv)
"""


def test_resident_memory_is_bounded_by_the_budget_and_untouched_blocks_cost_none(long_context):
    """A 512 MiB budget: the pool takes at most the budget, and after a short request the process has grown by far
    less than the pool (its pages are mapped as blocks are first written), not by the pool's whole size."""
    budget = 512 * 2 ** 20
    done = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(long_context), str(budget)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    before, after, kv = map(int, done.stdout.split()[-3:])
    assert 0.99 * budget <= kv <= budget   # every slot at max_model_len (16 x 64k x 512 B) is just above
    assert after - before < 192 * 2 ** 20, (before, after, kv)


def test_a_tied_embedding_is_held_once(good):
    """tie_word_embeddings with a float32 head: one [H, V] array serves the head and the lookup (the table is not
    stored a second time), and the lookup returns the checkpoint's rows exactly."""
    import numpy as np
    import paddle
    from fastdeploy.model_executor.models import get_model
    from tests.checkpoint_files import read_tensors
    model = get_model(str(good))
    table = read_tensors(good)["model.embed_tokens.weight"]
    assert model.net.embed.is_tied and "embed.weight" not in model.net.state_dict()
    assert model.weight_bytes() == 4 * sum(t.size for t in read_tensors(good).values())
    ids = paddle.to_tensor([0, 5, 383, 5], dtype="int64")
    assert np.array_equal(model.net.embed(ids).numpy(), table[[0, 5, 383, 5]])
