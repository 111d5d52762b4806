"""benchmarks/op_gaps.py in smoke mode: both tables print, every op and gap of the pass gets a row (no figure is
asserted: no timed assertions in tests)."""
import pytest

from benchmarks import op_gaps
from fastdeploy.model_executor.layers import cpu_rms_norm


@pytest.mark.skipif(not cpu_rms_norm.AVAILABLE, reason="the CPU ops need the CPU's own AVX-512 kernels")
def test_both_tables_print(capsys):
    op_gaps.main(["--smoke", "--rows", "1", "--context", "16", "--reps", "1", "--read-mib", "0", "1"])
    out = capsys.readouterr().out
    assert "1 row(s), context 16: step" in out and "warm glue" in out
    ops = {line[7:].rsplit(None, 2)[0] for line in out.splitlines() if line.startswith("  op ")}
    # a dense model's decode pass: every layer in one op, then the final norm and the head
    assert "rms_norm" in ops and any(op.startswith("decoder stack x") for op in ops), ops
    assert any(line.startswith("  gap  decoder stack x") and "-> rms_norm" in line for line in out.splitlines())
    assert "after 1 MiB" in out and "Paddle swiglu" in out and "elsewhere" in out


@pytest.mark.skipif(not cpu_rms_norm.AVAILABLE, reason="the CPU ops need the CPU's own AVX-512 kernels")
def test_layers_apart_show_each_layers_two_ops(capsys):
    op_gaps.main(["--smoke", "--rows", "1", "--context", "16", "--reps", "1", "--read-mib", "0", "--layers-apart"])
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("  gap  norm + attention, 4 heads -> norm + mlp") for line in lines)
    assert not any("decoder stack" in line for line in lines)
