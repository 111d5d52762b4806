"""benchmarks/layer_one_op.py in smoke mode: a row per precision and row count for each form and some together (no
figure is asserted: no timed assertions in tests)."""
import pytest

from benchmarks import layer_one_op
from fastdeploy.model_executor.layers import cpu_rms_norm


@pytest.mark.skipif(not cpu_rms_norm.AVAILABLE, reason="the one-op forms need the CPU's own AVX-512 kernels")
@pytest.mark.parametrize("forms", [["attention"], ["mlp"], ["stack"], ["stack", "attention", "mlp"]])
def test_a_row_per_precision_and_row_count(capsys, forms):
    layer_one_op.main(["--smoke", "--precision", "float32", "wint8", "--rows", "1", "3", "--context", "16",
                       "--reps", "2", "--forms", *forms])
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.split() and line.split()[0] in ("float32", "wint8")]
    assert [(r[0], r[1]) for r in rows] == [("float32", "1"), ("float32", "3"), ("wint8", "1"), ("wint8", "3")]
    assert all(len(r) == 5 and float(r[4]) > 0 for r in rows)
    assert "elsewhere" in lines[-1]
