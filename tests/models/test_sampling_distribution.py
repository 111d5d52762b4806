"""The distribution the engine samples each emitted position from equals transformers' logits processors applied to
transformers' logits of the same prefix, within 1e-5 at every position: single instance, PD (P and D in this
process over ZeroMQ) and MTP K = 1 and 2, on the tiny ERNIE-4.5 MoE + MTP checkpoint.

The engine side is the runner's `distribution_hook` (sampler.DistributionHook): the probability vector [V] each
emitted token is drawn from, after penalties, temperature, min_p, top_k and top_p. The reference side
(tests/reference/sampling_distribution.py, a subprocess: torch never shares a process with paddle) runs
`Ernie4_5_MoeForCausalLM` in float64 on prompt + the engine's tokens and applies `RepetitionPenaltyLogitsProcessor`,
vLLM's documented frequency / presence formula, `TemperatureLogitsWarper`, `MinPLogitsWarper`, `TopKLogitsWarper`
and `TopPLogitsWarper` in the engine's order (vLLM v1's: min_p before top_k / top_p).

Documented difference (docs/serving.md "Sampling controls"): transformers' `generate` applies min_p after top_k /
top_p; with min_p and top_p < 1 both set that is another distribution, and `test_generate_order_differs` shows the
request that sets both is one where it differs.

Tolerance 1e-5: both sides compute in float64 from the same weights; the engine's paged attention and fused MoE
differ from transformers' eager modules only by rounding order (logits agree to ~1e-12), so any difference above
1e-5 is a different rule (a processor, its order, a kept-set boundary or the penalty context), not rounding.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fastdeploy.entrypoints.pd_builder import build_engine, with_role
from fastdeploy.model_executor.models import get_model
from fastdeploy.config import SpeculativeConfig
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise.zmq_transport import ZmqTransport

from tests import checkpoint_files as cf
from tests.models.test_ernie4_5_moe_mtp import config
from tests.pd.test_pd_zmq_faults import BOUND_STEPS, DEADLINES
from tests.splitwise.fakes import FakeClock

pytestmark = pytest.mark.skipif(cf.reference_missing() is not None, reason=str(cf.reference_missing()))

REFERENCE = Path(__file__).resolve().parents[1] / "reference" / "sampling_distribution.py"
TOLERANCE = 1e-5
MAX_TOKENS = 10
HANG_S = 180.0
NEUTRAL = dict(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0, frequency_penalty=0.0,
               presence_penalty=0.0)
# Each control alone and together; the seeds tell the requests apart in the hook
CONTROLS = [
    dict(temperature=0.8, top_k=20, repetition_penalty=1.3, seed=11),
    dict(temperature=1.1, min_p=0.05, top_p=0.9, frequency_penalty=0.5, presence_penalty=0.3, seed=12),
    dict(temperature=0.7, top_p=0.8, top_k=50, repetition_penalty=0.8, presence_penalty=-0.5, seed=13),
    dict(temperature=1.0, min_p=0.1, frequency_penalty=-0.4, seed=14),
    dict(temperature=0.0, repetition_penalty=1.2, frequency_penalty=0.3, seed=15),
]


def cases() -> list[tuple[list[int], dict]]:
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, 384, 13).tolist()
    return [(prompt[:9 + i] if i % 2 else prompt[i:], {**NEUTRAL, **c}) for i, c in enumerate(CONTROLS)]


def params(controls: dict) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, **controls)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sampling_distribution")
    report = cf.write_ernie4_5_moe_checkpoint(root / "ckpt", layout="paddle", seed=5)
    return {"directory": root / "ckpt", "torch_directory": report["torch_directory"]}


@pytest.fixture(scope="module")
def models(checkpoint) -> dict:
    return {k: get_model(str(checkpoint["directory"]), dtype="float64",
                         speculative=SpeculativeConfig("mtp", k) if k else None) for k in (0, 1, 2)}


class Recorder:
    """The runner's distribution_hook: (seed, output index) -> the probabilities the draw used."""

    def __init__(self):
        self.seen: dict[tuple[int, int], list[np.ndarray]] = {}
        self.steps = 0                                    # the loop's step count, bumped by the runs below
        self.per_step: dict[tuple[int, int], int] = {}    # (seed, step) -> positions drawn in that step

    def __call__(self, slot, sampling, out_index, probs) -> None:
        self.seen.setdefault((sampling.seed, out_index), []).append(probs.copy())
        key = (sampling.seed, self.steps)
        self.per_step[key] = self.per_step.get(key, 0) + 1


def run_single(checkpoint, models, k: int, recorder: Recorder) -> list:
    engine = build_engine(config(checkpoint["directory"], k, False), models[k])
    engine.runner.distribution_hook = recorder
    try:
        requests = [engine.add_request(f"r{i}", p, params(c)) for i, (p, c) in enumerate(cases())]
        for _ in range(BOUND_STEPS):
            engine.step()
            recorder.steps += 1
            if not engine.has_unfinished():
                break
        assert not engine.has_unfinished(), "the workload did not finish within the step bound"
        return requests
    finally:
        engine.close()


def run_pd(checkpoint, models, k: int, recorder: Recorder) -> list:
    """P (which samples t0) and D (the rest) both record."""
    cfg = config(checkpoint["directory"], k, False)
    p_transport, d_transport = ZmqTransport(listen="127.0.0.1:0"), ZmqTransport()
    prefill = build_engine(with_role(cfg, "prefill"), models[k], p_transport, clock=FakeClock(),
                           deadlines=DEADLINES, idle_poll_s=0.0)
    decode = build_engine(with_role(cfg, "decode"), models[k], d_transport, deadlines=DEADLINES)
    prefill.runner.distribution_hook = decode.runner.distribution_hook = recorder
    try:
        requests = []
        for i, (prompt, controls) in enumerate(cases()):
            info = {"request_id": f"r{i}", "prefill_addr": p_transport.address}
            prefill.add_request(f"r{i}", prompt, params(controls), disaggregate_info=info)
            requests.append(decode.add_request(f"r{i}", prompt, params(controls), disaggregate_info=info))
        hang, steps = time.monotonic() + HANG_S, 0   # a hang guard, not a time limit (test_ernie4_5_moe_mtp)
        while prefill.has_unfinished() or decode.has_unfinished():
            if steps >= BOUND_STEPS and time.monotonic() > hang:
                break
            prefill.step()
            decode.step(max_wait_s=0.005)
            steps += 1
            recorder.steps += 1
        assert not prefill.has_unfinished() and not decode.has_unfinished(), "not finished within the step bound"
        return requests
    finally:
        prefill.close()
        decode.close()


def reference(checkpoint, tokens: list[list[int]]) -> dict:
    request = {"directory": checkpoint["torch_directory"],
               "cases": [{"prompt": p, "tokens": t, **{n: c[n] for n in NEUTRAL}}
                         for (p, c), t in zip(cases(), tokens)]}
    done = subprocess.run([sys.executable, str(REFERENCE)], input=json.dumps(request), capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"sampling_distribution failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout)


# single, PD, MTP K = 1 and 2 in three runs (each costs an engine run and a reference process): PD with K = 1
# covers P's first token, D's continuation and K = 1 verification together
RUNS = {"single": (run_single, 0), "pd_mtp1": (run_pd, 1), "mtp2": (run_single, 2)}


@pytest.fixture(scope="module")
def outcome(checkpoint, models):
    """name -> (emitted tokens per case, the recorder, transformers' distributions)."""
    results, references = {}, {}

    def get(name: str):
        if name not in results:
            run, k = RUNS[name]
            recorder = Recorder()
            tokens = [list(r.output_token_ids) for r in run(checkpoint, models, k, recorder)]
            key = repr(tokens)   # the runs emit the same tokens when lossless: one reference process for them
            if key not in references:
                references[key] = reference(checkpoint, tokens)
            results[name] = (tokens, recorder, references[key])
        return results[name]
    return get


@pytest.mark.parametrize("name", list(RUNS))
def test_engine_distribution_is_transformers_processors(outcome, name):
    tokens, recorder, ref = outcome(name)
    worst = 0.0
    for (prompt, controls), emitted, expected in zip(cases(), tokens, ref["engine_order"]):
        assert len(emitted) == MAX_TOKENS
        for i in range(MAX_TOKENS):
            recorded = recorder.seen.get((controls["seed"], i))
            assert recorded, f"{name}: no distribution recorded for seed {controls['seed']} position {i}"
            for probs in recorded:   # a position is drawn once; a recomputation must draw from the same
                diff = float(np.abs(probs - np.asarray(expected[i])).max())
                worst = max(worst, diff)
                assert diff <= TOLERANCE, f"{name}: {controls} position {i}: max |p - p_ref| = {diff:.3g}"
            assert recorded[-1][emitted[i]] > 0, f"{name}: position {i} emitted a token outside the kept set"
    assert len(recorder.seen) == len(CONTROLS) * MAX_TOKENS, f"{name}: positions recorded beyond the emitted ones"
    if RUNS[name][1]:   # not vacuous under MTP: some round accepted a draft (several positions drawn in one step)
        assert max(recorder.per_step.values()) > 1, f"{name}: no draft accepted, the verify path went unchecked"


def test_generate_order_differs(outcome):
    """The documented difference: transformers' generate order (min_p after top_p) gives another distribution for
    the request that sets both min_p and top_p < 1, and the same one for the others."""
    _, _, ref = outcome("single")
    for (_, controls), engine, generate in zip(cases(), ref["engine_order"], ref["generate_order"]):
        diff = float(np.abs(np.asarray(engine) - np.asarray(generate)).max())
        if controls["min_p"] > 0 and controls["top_p"] < 1:
            assert diff > TOLERANCE, "min_p + top_p: the two orders should differ somewhere"
        else:
            assert diff <= TOLERANCE
