"""The P800 self-check (docs/kunlun3.md "On a P800"): without a device it says so, runs the emulator equivalents of
every part and exits 0 with that fact in its last line; on a device (marked xpu) it checks the chip."""

import json

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.ops import _kl3_pybind
from fastdeploy.tools import kunlun_selfcheck, op_parity

HAS_DEVICE = (paddle.is_compiled_with_xpu() and paddle.device.xpu.device_count() > 0
              and _kl3_pybind.VENDOR_BUILD)


@pytest.mark.skipif(HAS_DEVICE, reason="this machine has a Kunlun device; the xpu test covers it")
def test_without_a_device_the_emulator_equivalents_run_and_the_last_line_says_so(tmp_path, capsys):
    """XPU3_KERNEL_MODEL §14, OPS §8 C1, PD_MTP_FLOW §10 on the emulator: every part passes, exit status 0, the
    last line states that nothing ran on hardware, and --json holds the same parts."""
    out = tmp_path / "selfcheck.json"
    assert kunlun_selfcheck.main(["--json", str(out), "--cases", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("VERDICT: no Kunlun device; nothing ran on Kunlun hardware")
    assert lines[-1].endswith("passed")
    report = json.loads(out.read_text())
    assert report["on_device"] is False and report["backend"] == "xpu3-emulator"
    assert [p["name"] for p in report["parts"]] == ["environment", "op parity vs CPU path",
                                                      "hardware probes (XPU3_KERNEL_MODEL §14)",
                                                      "PD + MTP end to end (fd-tiny)"]
    assert all(p["ok"] for p in report["parts"])
    parity = report["parts"][1]
    assert {row[2] for row in parity["rows"]} == {"1", "2", "12"}
    assert sum(row[4] == "identical" for row in parity["rows"]) == len(parity["rows"]) == 7 * 3
    assert sum("verdict [PASS]" in line for line in lines) == 4


def test_a_differing_tensor_is_reported_by_name():
    """The parity comparison is not vacuous: a single differing element names its tensor, or "result"."""
    same = ({"a": np.zeros(3), "b": None}, np.ones(2))
    assert op_parity._difference(same, ({"a": np.zeros(3), "b": None}, np.ones(2))) == ""
    assert op_parity._difference(same, ({"a": np.array([0.0, 1.0, 0.0]), "b": None}, np.ones(2))) == "a"
    assert op_parity._difference(same, ({"a": np.zeros(3), "b": None}, np.zeros(2))) == "result"


def test_tables_are_aligned_and_end_with_the_verdict():
    part = kunlun_selfcheck.Part("demo", ["op", "result"], [["x", "identical"], ["longer_name", "2 differ"]],
                                 ok=False, verdict="MISMATCH")
    text = kunlun_selfcheck.render(part).splitlines()
    assert text[0] == "== demo"
    assert text[1].index("result") == text[3].index("identical") == text[4].index("2 differ")
    assert text[-1] == "verdict [FAIL]: MISMATCH"


def test_bad_case_count_is_refused_naming_the_option():
    with pytest.raises(SystemExit) as exc:
        kunlun_selfcheck.main(["--cases", "0"])
    assert exc.value.code == 2


@pytest.mark.xpu
@pytest.mark.skipif(not HAS_DEVICE, reason="needs a Kunlun device, paddlepaddle-xpu and a vendor build of the ops")
def test_on_a_p800_every_part_passes(tmp_path, capsys):
    """On the chip: op parity at 1, 2 and the device's cluster count, probes observed, PD + MTP with the state on
    XPU:0 equal to the CPU path."""
    assert kunlun_selfcheck.main(["--json", str(tmp_path / "r.json")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "VERDICT: Kunlun P800 check passed"


@pytest.mark.skipif(HAS_DEVICE, reason="this machine has a Kunlun device; the xpu test covers it")
def test_a_checkpoint_adds_a_real_model_pd_mtp_part_run_on_the_cpu(tmp_path):
    """--model DIR: PD + MTP (K = 1) on an ERNIE-4.5 MoE checkpoint with its MTP module equals the single instance,
    says it ran on the CPU, and counts accepted drafts; a checkpoint that cannot serve MTP fails with its line."""
    from tests import checkpoint_files as cf
    if cf.reference_missing():
        pytest.skip(cf.reference_missing())
    cf.write_ernie4_5_moe_checkpoint(tmp_path / "moe", seed=2)
    target = kunlun_selfcheck.find_target()
    part = kunlun_selfcheck.check_checkpoint_pd_mtp(target, str(tmp_path / "moe"))
    assert part.ok, part
    assert "on the CPU" in part.verdict and len(part.rows) == len(kunlun_selfcheck.PROMPTS)
    assert all(row[-1] == "identical" and "/" in row[3] for row in part.rows)
    quantized = kunlun_selfcheck.check_checkpoint_pd_mtp(target, str(tmp_path / "moe"), dtype="bfloat16",
                                                         quantization="wint8")
    assert quantized.ok, quantized
    assert "bfloat16, wint8" in quantized.name
    (tmp_path / "empty").mkdir()
    broken = kunlun_selfcheck.check_checkpoint_pd_mtp(target, str(tmp_path / "moe"), str(tmp_path / "empty"))
    assert broken.ok is False and "empty" in broken.verdict and "\n" not in broken.verdict


def test_mtp_model_needs_model():
    with pytest.raises(SystemExit) as exc:
        kunlun_selfcheck.main(["--mtp-model", "/tmp"])
    assert exc.value.code == 2
