"""The import path FastDeploy's GPU model runners and op tests use: `fastdeploy.model_executor.ops.gpu`.

The same seven ops as `fastdeploy.model_executor.ops.xpu` (FastDeploy's names, OPS.md §5 signatures), so a
runner that imports from `.gpu` runs here on the host tensors of the CPU build. This project has no CUDA kernels:
a tensor on a CUDA place is refused like any other unsupported place (docs/design.md §1).
"""

from fastdeploy.model_executor.ops.xpu import *  # noqa: F403 -- one list of names, kept in xpu.py
from fastdeploy.model_executor.ops.xpu import __all__  # noqa: F401
