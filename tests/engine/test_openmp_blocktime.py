"""`import fastdeploy` puts the workers of Intel's OpenMP runtime (Paddle's MKL) to sleep at once after each parallel
region (KMP_BLOCKTIME=0, fastdeploy/__init__.py; measured in benchmarks/openmp_blocktime.py), never over the user's
own value, and the runtime Paddle loads takes the value (its own `kmp_get_blocktime`)."""
from __future__ import annotations

import os
import subprocess
import sys

CODE = """
import ctypes, os, fastdeploy, paddle
paddle.matmul(paddle.ones([64, 64]), paddle.ones([64, 64]))   # Paddle's MKL: Intel's runtime starts
iomp = ctypes.CDLL(os.path.join(os.path.dirname(paddle.__file__), "libs", "libiomp5.so"))
print(os.environ.get("KMP_BLOCKTIME"), iomp.kmp_get_blocktime())
"""


def blocktime(**env: str) -> str:
    """The environment's KMP_BLOCKTIME after `import fastdeploy`, and the runtime's, in a fresh process."""
    clean = {k: v for k, v in os.environ.items() if k != "KMP_BLOCKTIME"}
    return subprocess.run([sys.executable, "-c", CODE], env={**clean, **env}, capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()[-1]


def test_import_sets_zero_and_intels_runtime_takes_it():
    assert blocktime() == "0 0"


def test_the_users_value_wins():
    assert blocktime(KMP_BLOCKTIME="50") == "50 50"
