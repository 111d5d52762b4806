"""benchmarks/step_overhead.py runs (its figures are not asserted: no timed assertions in tests)."""
from benchmarks.step_overhead import host_ms, main


def test_the_decode_steps_with_every_request_running_are_measured(capsys):
    times = host_ms(rows=4, k=1, steps=6)
    assert len(times) >= 3 and all(t == t for t in times)   # some steps, no NaN
    main(["--rows", "2", "--k", "0", "--steps", "4"])
    out = capsys.readouterr().out
    assert "K=0 ms" in out and "elsewhere:" in out
