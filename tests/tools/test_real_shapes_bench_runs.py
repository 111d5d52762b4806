"""benchmarks/real_shapes.py in smoke mode runs every shape and prints every row, the C = 16 decode step's among them
(its figures are not asserted: no timed assertions in tests)."""
from benchmarks import real_shapes


def test_every_shape_prints_its_rows(capsys):
    real_shapes.main(["--smoke", "--prompt", "16", "--reps", "1"])
    out = capsys.readouterr().out
    sections = out.split("\n== ")[1:]
    assert [s.split(" ")[0] for s in sections] == list(real_shapes.SHAPES)
    for section in sections:
        rows = {line[:22].strip(): line[22:].split() for line in section.splitlines()[1:] if line[:1] != " "}
        for row in ("decode b=1", "verify b=1, K=1", f"decode b={real_shapes.BATCH_ROWS}", "weights read once"):
            assert rows[row][1] == "ms" and float(rows[row][0]) > 0, (row, section)
        assert rows[f"decode b={real_shapes.BATCH_ROWS} / read"][1] == "x", section
    assert "elsewhere" in out
