"""Structural rules (docs/design.md §5): the engine, the token processor (output/) and the HTTP front end import no paddle;
device runners share one base (no duplicated code under fastdeploy/worker)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "fastdeploy" / "worker"


def test_engine_package_does_not_import_paddle():
    """nothing under fastdeploy/engine imports paddle (checked in a fresh interpreter)."""
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
            "import importlib, pkgutil, fastdeploy.engine as e\n"
            "for m in pkgutil.walk_packages(e.__path__, 'fastdeploy.engine.'): importlib.import_module(m.name)\n"
            "import fastdeploy.schema.core_protocol, fastdeploy.schema.step_io\n"
            "import fastdeploy.config\n"
            "sys.exit(1 if 'paddle' in sys.modules else 0)\n")
    # -I: no PYTHONPATH / sitecustomize that could import paddle on the engine's behalf
    result = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _imports_paddle(packages: list[str]) -> subprocess.CompletedProcess:
    """Import every module of `packages` in a fresh interpreter; exit status 1 if paddle got loaded."""
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
            "import importlib, pkgutil\n"
            f"for name in {packages!r}:\n"
            "    package = importlib.import_module(name)\n"
            "    for m in pkgutil.iter_modules(getattr(package, '__path__', [])):\n"
            "        importlib.import_module(name + '.' + m.name)\n"
            "sys.exit(1 if 'paddle' in sys.modules else 0)\n")
    return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)


def test_output_package_does_not_import_paddle():
    """the token processor decodes step messages with the framework-free step_message module."""
    result = _imports_paddle(["fastdeploy.output"])
    assert result.returncode == 0, result.stderr or "fastdeploy.output loaded paddle"


def test_http_front_end_does_not_import_paddle():
    """DESIGN "Services": the API server (entrypoints/openai, metrics, the engine core client, the chat template)
    never imports paddle; only the engine core process loads it, through the instance builder."""
    result = _imports_paddle(["fastdeploy.entrypoints.openai", "fastdeploy.metrics", "fastdeploy.engine.core_client",
                              "fastdeploy.entrypoints.chat_template"])
    assert result.returncode == 0, result.stderr or "the front end loaded paddle"


def _code_lines(path: Path) -> list[str]:
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", "import ", "from ", '"""', "@")) and line not in (")", "]", "}"):
            lines.append(line)
    return lines


def test_no_duplicated_code_across_worker_modules():
    """no run of 4 code lines appears twice anywhere under fastdeploy/worker."""
    seen: dict[tuple[str, ...], str] = {}
    for path in sorted(WORKER.glob("*.py")):
        lines = _code_lines(path)
        for i in range(len(lines) - 3):
            window = tuple(lines[i:i + 4])
            where = f"{path.name}:{i}"
            assert window not in seen, f"duplicated code at {where} and {seen[window]}: {window}"
            seen[window] = where
