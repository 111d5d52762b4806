"""MTP is lossless on an ERNIE-4.5 MoE checkpoint with its own MTP weights (PD_MTP_FLOW §10): K = 1 and 2
emit the K = 0 tokens, greedy and seeded, on a single instance and on a P/D pair in this process over the ZeroMQ
connector and over Mooncake, with the prefix cache on and off. Every run also asserts that drafts were both
accepted and rejected: the fixture's MTP projection is fitted to agree with the target often but not always
(tests/reference/ernie4_5_moe_torch.py), so the check cannot pass with an MTP that never or always agrees."""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fastdeploy.config import CacheConfig, FDConfig, SchedulerConfig, SpeculativeConfig
from fastdeploy.entrypoints.pd_builder import build_engine, with_role
from fastdeploy.model_executor.models import get_model
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from fastdeploy.splitwise.zmq_transport import ZmqTransport

from tests import checkpoint_files as cf
from tests.pd.test_pd_zmq_faults import BOUND_STEPS, DEADLINES, assert_free
from tests.splitwise.fakes import FakeClock

pytestmark = pytest.mark.skipif(cf.reference_missing() is not None, reason=str(cf.reference_missing()))

BLOCK = 8
MAX_TOKENS = 20


def workload() -> list[tuple[list[int], SamplingParams]]:
    """Prompts over several blocks that share prefixes (a repeat, an extension, a shared head), half greedy and
    half seeded sampling; EOS ignored so every request decodes its full length."""
    rng = np.random.default_rng(7)
    base = rng.integers(3, 384, 2 * BLOCK + 3).tolist()
    other = rng.integers(3, 384, BLOCK + 5).tolist()
    prompts = [base, other, base, base + [17, 18, 19], base[:BLOCK + 1] + other[:4], other[::-1]]
    cases = []
    for i, prompt in enumerate(prompts):
        sampled = i % 2 == 1
        cases.append((prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True,
                                             temperature=0.9 if sampled else 0.0, seed=100 + i if sampled else None)))
    return cases


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ernie_moe_mtp")
    cf.write_ernie4_5_moe_checkpoint(root / "ckpt", layout="paddle", seed=5)
    return root / "ckpt"


@pytest.fixture(scope="module")
def models(checkpoint) -> dict:
    """One loaded model per K (float64); P and D of a pair share it (their caches are their own)."""
    return {k: get_model(str(checkpoint), dtype="float64",
                         speculative=SpeculativeConfig("mtp", k) if k else None) for k in (0, 1, 2)}


def config(checkpoint: Path, k: int, prefix_caching: bool, protocol: str = "zmq", backend: str = "cpu",
           precision: dict | None = None) -> FDConfig:
    """precision: FDConfig's dtype / quantization (default float64; tests/models/test_precision_mtp.py)."""
    return FDConfig(model=str(checkpoint), **(precision or {"dtype": "float64"}),
                    speculative=SpeculativeConfig("mtp", k) if k else
                    SpeculativeConfig(), enable_prefix_caching=prefix_caching, ops_backend=backend,
                    cache=CacheConfig(block_size=BLOCK, transfer_protocol=protocol),
                    scheduler=SchedulerConfig(max_num_seqs=3, max_model_len=128, max_num_batched_tokens=64))


def run_single(checkpoint, models, k: int, prefix_caching: bool, cases=None, backend: str = "cpu",
               precision: dict | None = None) -> list:
    engine = build_engine(config(checkpoint, k, prefix_caching, backend=backend, precision=precision), models[k])
    try:
        requests = [engine.add_request(f"r{i}", p, sp) for i, (p, sp) in enumerate(cases or workload())]
        for _ in range(BOUND_STEPS):
            engine.step()
            if not engine.has_unfinished():
                break
        assert not engine.has_unfinished(), "the workload did not finish within the step bound"
        assert_free(engine)
        return requests
    finally:
        engine.close()


def run_pd(checkpoint, models, k: int, prefix_caching: bool, protocol: str, cases=None,
           backend: str = "cpu", precision: dict | None = None) -> list:
    """P and D in this process over the ZeroMQ connector (and the Mooncake transfer engine for mooncake-tcp), the
    state ops on `backend` (the C++ CPU path, or the Kunlun3 kernels on the host emulator)."""
    cfg = config(checkpoint, k, prefix_caching, protocol, backend, precision)
    p_transport, d_transport = ZmqTransport(listen="127.0.0.1:0"), ZmqTransport()
    prefill = build_engine(with_role(cfg, "prefill"), models[k], p_transport, clock=FakeClock(),
                           deadlines=DEADLINES, idle_poll_s=0.0)
    decode = build_engine(with_role(cfg, "decode"), models[k], d_transport, deadlines=DEADLINES)
    try:
        requests = []
        for i, (prompt, params) in enumerate(cases or workload()):
            info = {"request_id": f"r{i}", "prefill_addr": p_transport.address}
            prefill.add_request(f"r{i}", prompt, params, disaggregate_info=info)
            requests.append(decode.add_request(f"r{i}", prompt, params, disaggregate_info=info))
        for _ in range(BOUND_STEPS):   # a hang guard (the seed mutants' hangs end here), not a time limit
            prefill.step()
            decode.step(max_wait_s=0.005)
            if not prefill.has_unfinished() and not decode.has_unfinished():
                break
        assert not prefill.has_unfinished() and not decode.has_unfinished(), "not finished within the step bound"
        assert_free(prefill)
        assert_free(decode)
        return requests
    finally:
        prefill.close()
        decode.close()


@pytest.fixture(scope="module")
def baseline(checkpoint, models) -> list[list[int]]:
    requests = run_single(checkpoint, models, 0, prefix_caching=False)
    assert all(r.finish_reason == "length" and len(r.output_token_ids) == MAX_TOKENS for r in requests)
    assert len({t for r in requests for t in r.output_token_ids}) >= 20   # varied text, not one repeated token
    return [r.output_token_ids for r in requests]


@pytest.fixture(scope="module")
def singles(checkpoint, models):
    """run_single's requests of the default workload per (K, prefix caching), each run once for the module."""
    done = {}

    def get(k: int, prefix_caching: bool) -> list:
        if (k, prefix_caching) not in done:
            done[k, prefix_caching] = run_single(checkpoint, models, k, prefix_caching)
        return done[k, prefix_caching]
    return get


def assert_lossless_and_not_vacuous(requests, baseline, k: int) -> None:
    assert [r.error for r in requests] == [None] * len(requests)
    assert [r.output_token_ids for r in requests] == baseline
    drafted = sum(r.metrics.num_draft_tokens for r in requests)
    accepted = sum(r.metrics.num_accepted_drafts for r in requests)
    assert accepted > 0, f"K={k}: no draft accepted of {drafted}"
    assert drafted - accepted > 0, f"K={k}: every one of {drafted} drafts accepted"
    if k == 2:   # some round accepted both drafts: the chained MTP pass (its own hidden fed back) was used
        assert any(n == 3 for r in requests for n in r.metrics.accepted_per_round)


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["cache-off", "cache-on"])
@pytest.mark.parametrize("k", [1, 2])
def test_single_instance_mtp_emits_the_k0_tokens(singles, baseline, k, prefix_caching):
    requests = singles(k, prefix_caching)
    assert_lossless_and_not_vacuous(requests, baseline, k)
    # the workload's shared prefixes do reach the cache when it is on
    assert (sum(r.num_cached_tokens for r in requests) >= 2 * BLOCK) == prefix_caching
    if prefix_caching:   # a cached block holds the MTP layer's KV too: the drafts do not change with the cache
        assert [r.metrics.accepted_per_round for r in requests] == \
            [r.metrics.accepted_per_round for r in singles(k, False)]


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["cache-off", "cache-on"])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("protocol", ["zmq", "mooncake-tcp"])
def test_pd_mtp_emits_the_single_instance_k0_tokens(checkpoint, models, singles, baseline, k, prefix_caching,
                                                    protocol):
    """The hand-off carries the MTP's KV (cache layer N) and the first-round drafts [t0, d1] (PD_MTP_FLOW §10)."""
    if protocol.startswith("mooncake"):
        reason = mooncake_unavailable_reason()
        if reason is not None:
            pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")
    requests = run_pd(checkpoint, models, k, prefix_caching, protocol)
    assert_lossless_and_not_vacuous(requests, baseline, k)
    # D drafts what a single instance drafts: its MTP cache holds P's prompt positions (layer N was handed off),
    # so every round accepts as many tokens as the single instance's same round
    single = singles(k, prefix_caching)
    assert [r.metrics.accepted_per_round for r in requests] == [r.metrics.accepted_per_round for r in single]


@pytest.mark.parametrize("k, backend", [(1, "cpu"), (2, "cpu"),
                                        pytest.param(1, "xpu3-emulator", marks=pytest.mark.emulator)])
def test_pd_seed_scenarios_on_the_moe_checkpoint(checkpoint, models, baseline, k, backend):
    """PD_MTP_FLOW §10.1 O4 on this model (stop_token_ids make a chosen token an EOS): EOS as t0 (D finishes at
    receipt), EOS in D's first round with d1 accepted and with d1 rejected (the FastDeploy hang: fixes 1-4), EOS
    inside an accepted run (K = 2), max_tokens 1 and 2. P/D gives the single instance's tokens, finish reasons and
    per-round acceptance, and frees every slot and block (run_pd's assert_free). The P/D pair runs the state ops
    on `backend`: the C++ CPU path, or the Kunlun3 kernels on the host emulator (the single instance, the
    reference, always on the CPU path)."""
    # prompts cut from greedy text (where the fitted MTP drafts best), so some first rounds accept d1
    texts = [p + out for (p, sp), out in zip(workload(), baseline) if sp.temperature == 0.0]
    greedy = [(text[:cut], SamplingParams(max_tokens=4, ignore_eos=True))
              for text in texts for cut in range(len(text) - 12, len(text) - 4, 2)]
    plain = run_single(checkpoint, models, k, False, greedy)
    cases, first_round = [], []
    for (prompt, params), request in zip(greedy, plain):
        out = request.output_token_ids
        for j in range(k + 1):          # stop at t0, in D's first round, inside its accepted run
            if out[j] not in out[:j]:
                cases.append((prompt, replace(params, stop_token_ids=[out[j]])))
                first_round.append((j, request.metrics.accepted_per_round[0]))
    cases += [(greedy[0][0], replace(greedy[0][1], max_tokens=1)), (greedy[0][0], replace(greedy[0][1], max_tokens=2))]
    # the hang case is really there: D's first round stops on an accepted d1, and on a corrected token
    assert any(j == 1 and n >= 2 for j, n in first_round) and any(j == 1 and n == 1 for j, n in first_round), \
        first_round
    single = run_single(checkpoint, models, k, False, cases)
    pd = run_pd(checkpoint, models, k, False, "zmq", cases, backend)
    assert [r.output_token_ids for r in pd] == [r.output_token_ids for r in single]
    assert [r.finish_reason for r in pd] == [r.finish_reason for r in single]
    assert [r.metrics.accepted_per_round for r in pd] == [r.metrics.accepted_per_round for r in single]
    assert [len(r.output_token_ids) for r in single[:len(first_round)]] == [j + 1 for j, _ in first_round]
    assert {r.finish_reason for r in single[:len(first_round)]} == {"stop"}


def relabeled_checkpoint(torch_dir: Path, directory: Path, a: int) -> Path:
    """A copy of the checkpoint with token ids 0 and `a` swapped: the rows of every vocabulary-indexed tensor (the
    embedding table and the head, both shared with the MTP module) exchanged, so the copy emits 0 exactly where the
    original emits `a`, given the prompt relabeled the same way."""
    shutil.copytree(torch_dir, directory)
    tensors = cf.read_tensors(torch_dir)
    vocab = tensors["model.embed_tokens.weight"].shape[0]
    swapped = {name for name, t in tensors.items() if t.shape[0] == vocab}
    assert swapped <= {"model.embed_tokens.weight", "lm_head.weight"}, swapped
    for name in swapped:
        t = tensors[name].copy()
        t[[0, a]] = t[[a, 0]]
        tensors[name] = t
    cf.write_tensors(directory, tensors, sharded=False)
    return directory


def swap_ids(tokens, a: int) -> list[int]:
    return [a if t == 0 else 0 if t == a else int(t) for t in tokens]


def test_token_id_0_ending_d_first_round_is_processed(checkpoint, models, baseline, tmp_path):
    """Fix (1) on this model (PD_MTP_FLOW §6 / I5): the token processor decides on a slot's count, never on its
    last token's value. The checkpoint is relabeled so that D's first round ends on token id 0, a valid token of
    the vocabulary; the pre-fix rule (skip an entry whose last token is <= 0) drops that round, so the request
    loses its tokens or, with 0 as its stop token, never finishes. Single instance and P/D give the original's
    tokens relabeled, and the stop case ends at D's first round."""
    k = 1
    texts = [p + out for (p, sp), out in zip(workload(), baseline) if sp.temperature == 0.0]
    greedy = [(text[:-8], SamplingParams(max_tokens=6, ignore_eos=True)) for text in texts]
    original = run_single(checkpoint, models, k, False, greedy)
    # the first request whose first round (t0 from P, then D's round) ends on an ordinary token
    (prompt, params), request = next(
        (case, r) for case, r in zip(greedy, original)
        if r.output_token_ids[r.metrics.accepted_per_round[0]] not in (0, 1, 2))
    n = request.metrics.accepted_per_round[0]
    a = request.output_token_ids[n]
    copy = relabeled_checkpoint(checkpoint.with_name(checkpoint.name + ".torch"), tmp_path / "relabeled", a)
    relabeled = {k: get_model(str(copy), dtype="float64", speculative=SpeculativeConfig("mtp", k))}
    cases = [(swap_ids(prompt, a), params), (swap_ids(prompt, a), replace(params, stop_token_ids=[0]))]
    expected = swap_ids(request.output_token_ids, a)
    assert expected[n] == 0
    for requests in (run_single(copy, relabeled, k, False, cases), run_pd(copy, relabeled, k, False, "zmq", cases)):
        assert [r.output_token_ids for r in requests] == [expected, expected[:n + 1]]
        assert [r.finish_reason for r in requests] == ["length", "stop"]
        assert requests[0].metrics.accepted_per_round[0] == n
