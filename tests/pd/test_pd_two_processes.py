"""PD across two processes over the ZeroMQ connector, no HTTP (SERVICES §6, §7; PD_MTP_FLOW O1, O3): P in a child
process, D here, each only knowing the other's connector address; greedy outputs equal the in-process PD pair's,
and both sides end with every slot and block free."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from fastdeploy.entrypoints.pd_builder import build_engine, with_role
from fastdeploy.model_executor.models import get_model
from fastdeploy.splitwise.zmq_transport import ZmqTransport

from .harness import run_pd, toy_config
from .test_pd_scenarios import eos_case

REPO = Path(__file__).resolve().parents[2]
K = 1
GIVE_UP_S = 60.0     # a bound that turns a hang into a failure; never an assertion on time


def cases():
    return [eos_case(f"r{i}", 2 + 3 * i, seed=70 + i) for i in range(3)] + \
        [eos_case("len2", 9, seed=74, max_tokens=2), eos_case("eos-t0", 0, seed=75)]


def test_p_and_d_in_two_processes_match_in_process_pd():
    """O1 and O2 across processes: tokens, finish reasons and per-round acceptance equal the in-process pair's
    (EOS as t0 and max_tokens 2 included); P reports every request handed off, and O3 holds on both sides."""
    workload = cases()
    reference = run_pd(workload, K)
    tokenizer = get_model("fd-toy").tokenizer
    stops = [[tokenizer.encode(s, add_special_tokens=False) for s in c.params.stop] for c in workload]
    d_transport = ZmqTransport()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    infos = [{"request_id": c.name} for c in workload]
    spec = [{"request_id": c.name, "prompt": c.prompt, "stop_seqs": s, "disaggregate_info": info,
             "params": {"max_tokens": c.params.max_tokens, "min_tokens": c.params.min_tokens}}
            for c, s, info in zip(workload, stops, infos)]
    child = subprocess.Popen([sys.executable, "-m", "tests.pd.prefill_process", str(K), json.dumps(spec)], cwd=REPO,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line, f"P did not start: {child.stderr.read()}"
        address = json.loads(line)["address"]
        decode = build_engine(with_role(toy_config(K), "decode"), get_model("fd-toy"), d_transport)
        requests = [decode.add_request(c.name, c.prompt, c.params, tuple(tuple(x) for x in s),
                                       disaggregate_info={**info, "prefill_addr": address})
                    for c, s, info in zip(workload, stops, infos)]
        give_up = time.monotonic() + GIVE_UP_S
        while decode.has_unfinished() and time.monotonic() < give_up:
            decode.step()
        assert not decode.has_unfinished(), "D did not finish within the bound"
        out, err = child.communicate(timeout=GIVE_UP_S)
        assert child.returncode == 0, err
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
        d_transport.close()
    p_summary = json.loads(out.strip().splitlines()[-1])
    for case, want, got in zip(workload, reference.requests, requests):
        assert got.error is None, f"{case.name}: {got.error}"
        assert (got.output_token_ids, got.finish_reason, got.metrics.accepted_per_round) == \
            (want.output_token_ids, want.finish_reason, want.metrics.accepted_per_round), f"O1/O2: {case.name}"
    assert p_summary["reported"] == {c.name: ["handed_off", None] for c in workload}
    assert not p_summary["unfinished"]
    assert (p_summary["free_slots"], p_summary["free_kv_blocks"]) == \
        (p_summary["total_slots"], p_summary["total_kv_blocks"])
    stats = decode.stats()
    assert (stats.free_slots, stats.free_kv_blocks) == (stats.total_slots, stats.total_kv_blocks)
