#!/usr/bin/env bash
# Installs this project on a Kunlun P800 machine (docs/kunlun3.md "On a P800"): the vendor build of setup.py
# against the installed paddlepaddle-xpu.
#
# Why not a bare `pip install -e .`: pip would build in an isolated environment with the CPU wheel named in
# build-system.requires (paddlepaddle==3.3.1, no XPU headers, is_compiled_with_xpu() false), and the
# `paddlepaddle==3.3.1` dependency would install the CPU wheel over paddlepaddle-xpu (a different distribution
# providing the same `paddle` module). So: the other requirements first, then the project without build
# isolation and without dependencies. Needs CLANG_PATH and XDNN_*/XRE_* (docs/kunlun3.md "Building").
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
PIP="${PIP:-$PYTHON -m pip}"

: "${CLANG_PATH:?p800_install: set CLANG_PATH to the XTDK root (docs/kunlun3.md, Building)}"
"$PYTHON" -c 'import sys, paddle
sys.exit(0 if paddle.is_compiled_with_xpu() else
         "p800_install: the installed paddle is not compiled with XPU; install paddlepaddle-xpu first")'

requirements=$("$PYTHON" - <<'PY'
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)
wanted = (project["build-system"]["requires"] + project["project"]["dependencies"]
          + project["project"]["optional-dependencies"]["test"])
print("\n".join(r for r in wanted if not r.replace("_", "-").lower().startswith("paddlepaddle")))
PY
)
# shellcheck disable=SC2086
$PIP install $requirements
$PIP install --no-build-isolation --no-deps -e .
