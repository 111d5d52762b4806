"""benchmarks/cpu_linear.py runs (its figures are not asserted: no timed assertions in tests)."""
from benchmarks.cpu_linear import main


def test_every_kind_and_kernel_gets_a_row(capsys):
    main(["--smoke"])
    out = capsys.readouterr().out
    assert "elsewhere" in out
    for kind in ("float32", "bf16", "int8", "int4"):
        assert f"| {kind} (" in out
    assert "| oneDNN |" in out
