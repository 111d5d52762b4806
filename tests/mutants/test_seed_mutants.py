"""The seed fixes stay guarded (PD_MTP_FLOW §8): every seed defect, reapplied to a scratch copy, is caught by the
tests that guard its fix (scripts/check_seed_mutants.py; docs/testing.md). Runs only with --mutants."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.mutants
@pytest.mark.timeout(1500)   # a rebuild of the plugin's extensions (~15 s on two cores) plus six targeted runs
def test_every_seed_defect_is_caught_by_its_targeted_tests():
    """PD_MTP_FLOW §8 fixes (1)-(4), fix (2) on the C++ CPU path and the kernel separately: each mutant makes
    its targeted tests fail; the script exits 0 only then (1 on a miss, 2 on a setup error)."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_seed_mutants.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=1400)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "5 of 5 seed mutants caught" in done.stdout, done.stdout
