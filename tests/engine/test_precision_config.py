"""The precision flags (fastdeploy/precision.py, docs/models.md "Precision"): their values and errors, `auto`,
and the precision in every identity that keys KV, so that instances of different precisions never share a block
or pair (a P in WINT8 and a D in bf16 are refused by the compatibility hash)."""
from __future__ import annotations

import pytest

from fastdeploy.config import CacheConfig, FDConfig, SpeculativeConfig
from fastdeploy.engine.connector.base import instance_config_hash
from fastdeploy.entrypoints.openai.serve_args import build_parser, config_from_args
from fastdeploy.precision import Quantization, cpu_has_avx512_bf16, parse_quantization, resolve_dtype
from tests.checkpoint_files import write_numpy_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(write_numpy_checkpoint(tmp_path_factory.mktemp("precision") / "ckpt", tokenizer=True))


@pytest.mark.parametrize("value, dense, moe", [
    (None, None, None), ("", None, None), ("wint8", "wint8", "wint8"), ("wint4", "wint4", "wint4"),
    ('{"quantization": "wint8"}', "wint8", "wint8"),
    ({"quantization": "mix_quant", "dense_quant_type": "wint8", "moe_quant_type": "wint4"}, "wint8", "wint4")])
def test_the_forms_fastdeploy_accepts(value, dense, moe):
    q = parse_quantization(value)
    assert (q.dense, q.moe) == (dense, moe)


def test_wint4_on_a_moe_model_is_dense_wint8_and_experts_wint4():
    assert parse_quantization("wint4").for_model(has_experts=True) == Quantization("wint8", "wint4")
    assert parse_quantization("wint4").for_model(has_experts=False) == Quantization("wint4", "wint4")
    explicit = parse_quantization({"quantization": "mix_quant", "dense_quant_type": "wint4", "moe_quant_type": "wint4"})
    assert explicit.for_model(has_experts=True) == Quantization("wint4", "wint4")   # as named, not reinterpreted


@pytest.mark.parametrize("value, field", [
    ("int8", "'quantization'"), ("{nope", "not valid JSON"), ({"quantization": "w8a8"}, "'quantization.quantization'"),
    ({"quantization": "mix_quant", "dense_quant_type": "wint2", "moe_quant_type": "wint4"},
     "'quantization.dense_quant_type'"), ({"quantization": "wint8", "group_size": 64}, "'quantization.group_size'"),
    (8, "'quantization'")])
def test_bad_values_are_refused_naming_the_field(value, field):
    with pytest.raises(ValueError, match=field):
        parse_quantization(value)


def test_auto_is_bf16_for_a_checkpoint_on_an_avx512_bf16_cpu_and_float32_for_embedded_models(checkpoint):
    assert resolve_dtype("auto", embedded=True) == "float32"
    assert resolve_dtype("auto", embedded=False) == ("bfloat16" if cpu_has_avx512_bf16() else "float32")
    config = FDConfig(model=checkpoint, dtype="auto")
    assert config.dtype == resolve_dtype("auto", embedded=False) and config.dtype_was_auto
    with pytest.raises(ValueError, match="'dtype'"):
        FDConfig(model=checkpoint, dtype="int8")


def test_every_precision_has_its_own_kv_identity_and_compatibility_hash(checkpoint):
    precisions = [dict(dtype="float32"), dict(dtype="bfloat16"), dict(dtype="bfloat16", quantization="wint8"),
                  dict(dtype="bfloat16", quantization="wint4"), dict(dtype="float32", quantization="wint8")]
    configs = [FDConfig(model=checkpoint, **p) for p in precisions]
    assert len({c.kv_identity for c in configs}) == len(configs)
    assert len({instance_config_hash(c, 384) for c in configs}) == len(configs)
    same = FDConfig(model=checkpoint, dtype="bfloat16", quantization='{"quantization": "wint8"}')
    assert instance_config_hash(same, 384) == instance_config_hash(configs[2], 384)   # one method, two spellings


def test_the_kv_dtype_keys_kv_and_the_pairing(checkpoint):
    """`auto` stores the KV in bf16 with --dtype bfloat16 and under quantization; a P with bf16 KV and a D with
    float32 KV (same weights) have different KV identities and compatibility hashes, so they are never paired."""
    bf16 = FDConfig(model=checkpoint, dtype="bfloat16")
    f32_kv = FDConfig(model=checkpoint, dtype="bfloat16", cache=CacheConfig(kv_cache_dtype="float32"))
    assert (bf16.kv_dtype, f32_kv.kv_dtype) == ("bfloat16", "float32")
    assert FDConfig(model=checkpoint, quantization="wint8").kv_dtype == "bfloat16"
    assert FDConfig(model=checkpoint).kv_dtype == "float32" and FDConfig(model="fd-tiny").kv_dtype == "float32"
    assert b"|kv=bfloat16|" in bf16.kv_identity and bf16.kv_identity != f32_kv.kv_identity
    assert instance_config_hash(bf16, 384) != instance_config_hash(f32_kv, 384)
    with pytest.raises(ValueError, match="CacheConfig: field 'kv_cache_dtype'"):
        CacheConfig(kv_cache_dtype="float16")


def test_a_bf16_kv_budget_holds_twice_the_blocks(checkpoint):
    budget = 2 ** 20
    f32 = FDConfig(model=checkpoint, dtype="bfloat16", cache=CacheConfig(kv_cache_memory_bytes=budget,
                                                                         kv_cache_dtype="float32"))
    bf16 = FDConfig(model=checkpoint, dtype="bfloat16", cache=CacheConfig(kv_cache_memory_bytes=budget))
    assert bf16.cache.num_kv_blocks == 2 * f32.cache.num_kv_blocks


def test_the_mtp_modules_quantization_keys_kv_too():
    base = SpeculativeConfig("mtp", 1)
    own = SpeculativeConfig("mtp", 1, quantization="wint4")
    assert FDConfig(model="fd-tiny", speculative=base).kv_identity != \
        FDConfig(model="fd-tiny", speculative=own).kv_identity
    with pytest.raises(ValueError, match="SpeculativeConfig: field 'quantization'"):
        SpeculativeConfig("mtp", 1, quantization="int3")


def test_the_server_flags_reach_the_engine_config(checkpoint):
    args = build_parser().parse_args(["--model", checkpoint, "--dtype", "bfloat16", "--quantization", "wint8"])
    config = config_from_args(args)
    assert (config.dtype, parse_quantization(config.quantization)) == ("bfloat16", Quantization("wint8", "wint8"))
    assert config.kv_dtype == "bfloat16"
    args = build_parser().parse_args(["--model", checkpoint, "--dtype", "bfloat16", "--kv-cache-dtype", "float32"])
    assert config_from_args(args).kv_dtype == "float32"


def test_embedded_models_refuse_a_reduced_precision():
    from fastdeploy.model_executor.models import get_model
    with pytest.raises(ValueError, match="float32"):
        get_model("fd-tiny", dtype="bfloat16")
    with pytest.raises(ValueError, match="float32"):
        get_model("fd-toy", quantization="wint8")
