"""benchmarks/step_overhead.py runs (its figures are not asserted: no timed assertions in tests)."""
from benchmarks.step_overhead import PARTS, host_ms, main, measure


def test_the_decode_steps_with_every_request_running_are_measured(capsys):
    times = host_ms(rows=4, k=1, steps=6)
    assert len(times) >= 3 and all(t == t for t in times)   # some steps, no NaN
    main(["--rows", "2", "--k", "0", "--steps", "4", "--parts"])
    out = capsys.readouterr().out
    assert "K=0 ms" in out and "elsewhere:" in out and "role decode" in out and "verify" in out


def test_the_null_model_leaves_the_parts_and_every_role_is_measured():
    for role in ("mixed", "decode", "prefill"):
        samples = measure(rows=3, k=1, steps=4, role=role, batches=2)
        assert samples and all(set(s.parts) == set(PARTS) for s in samples), role
    assert host_ms(rows=2, k=0, steps=4, model="fd-toy")
