"""benchmarks/long_prompt.py in smoke mode (tiny shapes and lengths): it runs end to end, both engines, and prints
both tables with a row per prompt length (the engine, transformers and the PD pair) and per chunk size (no timing
is asserted)."""
from __future__ import annotations

from benchmarks import long_prompt


def test_long_prompt_benchmark_runs_in_smoke_mode(capsys):
    long_prompt.main(["--smoke", "--shape", "dense-135m"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[0].startswith("dense-135m: 2 layers, hidden 128")
    assert "engine TTFT s" in lines[1] and "transformers s" in lines[1] and "PD TTFT s" in lines[1]
    row = [cell for cell in lines[2].split() if cell != "loaded"]   # a loaded machine marks its ratios
    assert row[:2] == ["40", "16"] and float(row[5]) > 0    # the PD pair's TTFT was measured
    assert "ms / token" in lines[3]
    assert [line.split()[1] for line in lines[4:6]] == ["16", "48"]
    assert all("elsewhere" in lines[i] for i in (2, 4, 5))
