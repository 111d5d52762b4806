"""Nothing the transport raises leaves the engine step (docs/design.md §8): a transport whose
`forget` and `ack` raise on every call (as the ZeroMQ transport's synchronous calls once did when its I/O thread
was starved) costs no engine step, every request completes as on a single instance, and each error is counted
(`transport_errors`, the `pd_transport_errors_total` metric)."""
from __future__ import annotations

from tests.e2e.workloads import run

from .harness import assert_drained, assert_same_as_single, drive, start_pd, submit
from .test_pd_scenarios import eos_case

K = 1


def test_a_transport_that_raises_fails_no_engine_step(monkeypatch):
    workload = [eos_case(f"r{i}", 3 + i % 4, seed=40 + i) for i in range(6)]
    pd = start_pd(K)
    transport, original_ack = pd.engine.transport, pd.engine.transport.ack
    calls = {"forget": 0, "ack": 0}

    def failing(name):
        def call(request_id, *args):
            calls[name] += 1
            if name == "ack":
                original_ack(request_id)   # P still frees its blocks: only the error is under test
            raise RuntimeError(f"test: the transport's {name} failed")
        return call

    monkeypatch.setattr(transport, "forget", failing("forget"))
    monkeypatch.setattr(transport, "ack", failing("ack"))
    submit(pd, workload)
    drive(pd)
    assert_drained(pd)
    assert_same_as_single(workload, run(workload, K), pd.requests)
    errors = pd.engine.prefill.pd_counters()["transport_errors"] + pd.engine.decode.pd_counters()["transport_errors"]
    assert calls["forget"] >= len(workload) and errors == calls["forget"] + calls["ack"]
