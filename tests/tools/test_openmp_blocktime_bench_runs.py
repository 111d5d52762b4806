"""benchmarks/openmp_blocktime.py runs: a row per thread count and concurrency, both block times (or both norms)
measured (its figures are not asserted: no timed assertions in tests)."""
import paddle
import pytest

from benchmarks.openmp_blocktime import PADDLE_NORM, main
from fastdeploy.model_executor.layers import cpu_rms_norm
from fastdeploy.model_executor.layers.transformer import RMSNorm


def test_a_row_per_thread_count_and_concurrency(capsys):
    main(["--smoke", "--prompt", "8", "--new-tokens", "4", "--threads", "1", "2", "--concurrency", "1", "2"])
    out = capsys.readouterr().out
    rows = [line.split("|")[1:3] for line in out.splitlines() if line.startswith("| ") and "OMP" not in line]
    assert [(t.strip(), c.strip()) for t, c in rows] == [("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")], out
    assert "elsewhere:" in out


def test_the_paddle_norm_cell_takes_the_layers_off_the_op(monkeypatch):
    """What the "Paddle's fused_rms_norm" cell runs first leaves RMSNorm on Paddle's kernel, not on the op."""
    monkeypatch.setattr(cpu_rms_norm, "AVAILABLE", cpu_rms_norm.AVAILABLE)   # restored after the exec
    monkeypatch.setattr(cpu_rms_norm, "rms_norm", lambda *args: pytest.fail("the op ran"))
    exec(PADDLE_NORM, {})
    RMSNorm(16)(paddle.ones([2, 16]))


def test_the_norm_comparison_names_both_norms(capsys):
    main(["--compare", "norm", "--smoke", "--prompt", "8", "--new-tokens", "4", "--threads", "2", "--concurrency", "2"])
    out = capsys.readouterr().out
    assert "| tok/s, Paddle's fused_rms_norm | tok/s, fd_cpu_rms_norm | own ÷ Paddle's |" in out, out
    assert [line.split("|")[1:3] for line in out.splitlines() if line.startswith("| 2 ")] == [[" 2 ", " 2 "]], out
