"""Loads custom_ops/xpu_ops/kl3_build.py (the shared build manifest; not a package) and setup.py's build logic for
the build tests."""

import importlib.util
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
XPU_OPS = ROOT / "custom_ops" / "xpu_ops"


def load_kl3_build():
    if "kl3_build" in sys.modules:
        return sys.modules["kl3_build"]
    spec = importlib.util.spec_from_file_location("kl3_build", XPU_OPS / "kl3_build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["kl3_build"] = module
    spec.loader.exec_module(module)
    return module


def load_setup():
    """setup.py's globals without running setup() (it runs only as __main__)."""
    load_kl3_build()
    return runpy.run_path(str(ROOT / "setup.py"), run_name="fd_setup")
