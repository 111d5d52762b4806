"""MTP and PD in each precision (docs/models.md "Precision"), on the ERNIE-4.5 MoE + MTP checkpoint of
test_ernie4_5_moe_mtp.py: K = 1 and 2 emit the K = 0 tokens, and PD (ZeroMQ, Mooncake) emits the single
instance's, in bfloat16, WINT8 and WINT4 (FastDeploy's mix_quant on MoE: dense WINT8, experts WINT4), each with
its KV cache in bf16 (`--kv-cache-dtype auto`): P's bf16 KV bytes are D's; the MTP module is quantized as asked.

The oneDNN products do not depend on the row count (a verify pass of K + 1 rows computes each row as a pass of
one would), but the float32 parts around them do (attention and the MoE router through Paddle's MKL, whose AVX2
GEMMs round by row count): so the workload is greedy, and where a request's tokens differ the first difference
must be a near-tie under the K = 0 run (its top-2 log probabilities within NEAR_TIE, which bf16's rounding of the
activations sets); such differences are counted and printed. Seeded sampling's equality is checked in float64 (test_ernie4_5_moe_mtp.py)."""
from __future__ import annotations

import pytest

from fastdeploy.config import FDConfig, SpeculativeConfig
from fastdeploy.model_executor.layers.quantization.weight_only import WeightOnly
from fastdeploy.model_executor.models import get_model
from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from fastdeploy.schema.sampling_params import SamplingParams
from tests.models.test_ernie4_5_moe_mtp import BLOCK, MAX_TOKENS, checkpoint, run_pd, run_single, workload  # noqa: F401

# the log-probability gap of the top two tokens within which the K = 0 run's choice may flip: float32 noise of
# ~1e-6 upstream of a linear layer moves its input across a bf16 rounding boundary now and then (a 2^-9 relative
# step of one element), and over the layers that reaches ~0.1 (measured: 0.073, WINT8, one request of six)
NEAR_TIE = 0.15


def greedy_cases():
    return [(prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0, logprobs=2))
            for prompt, _ in workload()]


def assert_k0_tokens_but_near_ties(requests, baseline, what: str) -> None:
    """Each request's tokens equal the K = 0 run's, or first differ where that run's top two were a near-tie."""
    assert [r.error for r in requests] == [None] * len(requests)
    ties = 0
    for r, b in zip(requests, baseline):
        if r.output_token_ids == b.output_token_ids:
            continue
        i = next(i for i, (x, y) in enumerate(zip(r.output_token_ids, b.output_token_ids)) if x != y)
        top = b.output_logprobs[i]
        assert r.output_token_ids[i] in top.top_token_ids[:2] and \
            top.top_logprobs[0] - top.top_logprobs[1] <= NEAR_TIE, (what, i, top)
        ties += 1
    print(f"{what}: {ties} of {len(requests)} requests differ, each first at a near-tie")
    drafted = sum(r.metrics.num_draft_tokens for r in requests)
    accepted = sum(r.metrics.num_accepted_drafts for r in requests)
    assert 0 < accepted < drafted or drafted == 0

PRECISIONS = {"bfloat16": {"dtype": "bfloat16"},
              "wint8": {"dtype": "bfloat16", "quantization": "wint8"},
              "wint4": {"dtype": "bfloat16", "quantization": "wint4"}}


@pytest.fixture(scope="module", params=list(PRECISIONS))
def precision(request, checkpoint):   # noqa: F811
    """(name, FDConfig fields, models per K, the K = 0 tokens)."""
    fields = PRECISIONS[request.param]
    models = {k: get_model(str(checkpoint), dtype=fields["dtype"], quantization=fields.get("quantization"),
                           speculative=SpeculativeConfig("mtp", k) if k else None) for k in (0, 1, 2)}
    baseline = run_single(checkpoint, models, 0, prefix_caching=False, cases=greedy_cases(), precision=fields)
    assert all(len(r.output_token_ids) == MAX_TOKENS for r in baseline)
    return request.param, fields, models, baseline


@pytest.mark.parametrize("k", [1, 2])
def test_mtp_emits_the_k0_tokens(checkpoint, precision, k):   # noqa: F811
    name, fields, models, baseline = precision
    requests = run_single(checkpoint, models, k, prefix_caching=True, cases=greedy_cases(), precision=fields)
    assert_k0_tokens_but_near_ties(requests, baseline, f"{name} K={k}")
    assert sum(r.metrics.num_accepted_drafts for r in requests) > 0
    assert sum(r.num_cached_tokens for r in requests) >= 2 * BLOCK


@pytest.mark.parametrize("protocol", ["zmq", "mooncake-tcp"])
def test_pd_emits_the_single_instance_tokens(checkpoint, precision, protocol):   # noqa: F811
    if protocol != "zmq" and mooncake_unavailable_reason():
        pytest.skip(mooncake_unavailable_reason())
    name, fields, models, baseline = precision
    assert FDConfig(model=str(checkpoint), **fields).kv_dtype == "bfloat16"
    requests = run_pd(checkpoint, models, 1, prefix_caching=True, protocol=protocol, cases=greedy_cases(),
                      precision=fields)
    assert_k0_tokens_but_near_ties(requests, baseline, f"{name} PD {protocol}")


def test_the_mtp_module_takes_the_speculative_configs_quantization(checkpoint):   # noqa: F811
    """Quantized as the target unless the speculative config names its own (FastDeploy's 'quantization' key)."""
    def bits(model):
        return {getattr(layer.method, "bits", None) for layer in model.mtp.sublayers() if hasattr(layer, "method")}

    as_target = get_model(str(checkpoint), dtype="bfloat16", quantization="wint8",
                          speculative=SpeculativeConfig("mtp", 1))
    own = get_model(str(checkpoint), dtype="bfloat16", quantization="wint8",
                    speculative=SpeculativeConfig("mtp", 1, quantization="wint4"))
    assert bits(as_target) == {8} and bits(own) == {4}
    experts = as_target.net.layers[1].mlp.experts_up_gate[0]
    assert isinstance(experts.method, WeightOnly) and experts.method.bits == 8
    mixed = get_model(str(checkpoint), dtype="bfloat16", quantization="wint4")
    assert mixed.net.layers[1].mlp.experts_up_gate[0].method.bits == 4   # ERNIE MoE's wint4: experts WINT4,
    assert mixed.net.layers[0].attn.qkv.method.bits == 8                  # dense layers WINT8
