"""Lossless sampling controls (docs/serving.md, "Sampling controls"): under each control, greedy and seeded
sampling emit the K = 0 single instance's tokens with MTP K = 1 and 2 and under PD (P's first token, D's
continuation over the prompt and what P emitted), on the e2e workload (fd-toy)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tests.e2e.workloads import Case, assert_same_outputs, run

from .harness import assert_same_as_single, run_pd, workload

# fd-toy's target logits are 2 (its choice), 1 (the runner-up) and <= 0: each value below moves the choice when
# the chosen token was seen, so every control changes some output of the workload
CONTROLS = {
    "repetition": dict(repetition_penalty=2.5),
    "frequency": dict(frequency_penalty=1.2),
    "presence": dict(presence_penalty=1.5),
    "all_penalties": dict(repetition_penalty=1.6, frequency_penalty=0.5, presence_penalty=0.5),
    "top_k": dict(top_k=2),
    "min_p": dict(min_p=0.2),
}
SAMPLED = dict(temperature=0.9, top_p=0.95)


def controlled(name: str, sampled: bool) -> list[Case]:
    """16 workload cases with at least 8 output tokens each, under CONTROLS[name] (seeded when `sampled`)."""
    cases = []
    for i, case in enumerate(workload(11)[:16]):
        params = replace(case.params, max_tokens=max(case.params.max_tokens, 8), **CONTROLS[name])
        if sampled:
            params = replace(params, seed=300 + i, **SAMPLED)
        cases.append(Case(case.name, case.prompt, params))
    return cases


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
@pytest.mark.parametrize("name", list(CONTROLS))
def test_mtp_and_pd_emit_the_k0_tokens_under_each_control(name, sampled):
    if name in ("top_k", "min_p") and not sampled:
        pytest.skip("top_k and min_p leave the argmax: greedy is the plain greedy workload")
    cases = controlled(name, sampled)
    base = run(cases, k=0)
    plain = run([Case(c.name, c.prompt, replace(c.params, **{f: getattr(type(c.params)(), f)
                                                             for f in CONTROLS[name]})) for c in cases], k=0)
    assert any(a.outputs.token_ids != b.outputs.token_ids for a, b in zip(base, plain)), \
        f"{name} changed no output: the test would not see it ignored"
    for k in (1, 2):
        single = run(cases, k=k)
        assert_same_outputs(cases, base, single)
        rounds = [n for r in single for n in r.metrics.accepted_per_round]
        assert 1 in rounds and k + 1 in rounds, "the workload must both reject and fully accept drafts"
        pd = run_pd(cases, k=k)
        assert_same_as_single(cases, single, pd.requests, per_round=True)
    assert_same_as_single(cases, base, run_pd(cases, k=0).requests, per_round=False)
