"""The host work per step reaches the step trace and the metric fastdeploy:step_host_seconds: each computing step
of the engine core reports its StepTimes.host (plus the core's delta building), and the API server's registry
observes one sample per step. No figure is asserted beyond being a non-negative time."""
from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.engine_core import EngineCore
from fastdeploy.metrics.metrics import ServerMetrics
from fastdeploy.schema.core_protocol import AddRequest
from fastdeploy.schema.step_io import STEP_PARTS


@pytest.mark.parametrize("k", [0, 1])
def test_every_computing_step_has_its_parts_in_the_trace(k):
    traces = []
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    llm = LLM(model="fd-toy", speculative_config=spec, trace_hook=traces.append)
    llm.generate(["Hello", "abc"], SamplingParams(max_tokens=6), use_tqdm=False)
    assert traces
    for trace in traces:
        times = trace.times
        assert all(getattr(times, part) >= 0.0 for part in (*STEP_PARTS, "passes"))
        assert times.host == pytest.approx(sum(getattr(times, part) for part in STEP_PARTS))
        assert times.passes == pytest.approx(trace.output.forward_seconds)
    assert any(t.times.draft > 0.0 for t in traces) == (k > 0)


def test_the_engine_core_reports_one_host_time_per_step_and_the_histogram_counts_them():
    core = EngineCore(LLM(model="fd-toy").engine)
    metrics = ServerMetrics()
    core.handle(AddRequest(request_id="a", prompt_token_ids=[256, 72, 105], params={"max_tokens": 5}))
    reported = []
    while core.has_work:
        outputs = core.step()
        reported += outputs.step_host_seconds
        metrics.on_outputs(outputs)
    assert len(reported) >= 5 and all(seconds >= 0.0 for seconds in reported)
    text = metrics.render().decode()
    assert f"fastdeploy:step_host_seconds_count {float(len(reported))}" in text
