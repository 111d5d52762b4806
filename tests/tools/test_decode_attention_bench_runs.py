"""benchmarks/decode_attention.py runs (its figures are not asserted: no timed assertions in tests)."""
import pytest

from benchmarks.decode_attention import main
from fastdeploy.model_executor.layers import fused_attention


@pytest.mark.skipif(not fused_attention.AVAILABLE, reason="the op needs the CPU's own AVX-512 kernels")
def test_every_shape_gets_a_row(capsys):
    main(["--rows", "1", "3", "--context", "5", "40", "--layers", "2", "--reps", "1", "--flush-mib", "1"])
    out = capsys.readouterr().out
    assert "elsewhere" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["3"])]
    assert {(r[0], r[1], r[2]) for r in rows} == {(a, b, c) for a in ("1", "3") for b in ("5", "40")
                                                    for c in ("float32", "bfloat16")}
