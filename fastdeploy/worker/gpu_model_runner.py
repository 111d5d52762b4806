"""The GPU model runner: the shared runner on the CPU op backend until CUDA kernels of the ops exist."""
from __future__ import annotations

from fastdeploy.worker.model_runner_base import ModelRunnerBase


class GPUModelRunner(ModelRunnerBase):
    @property
    def op_backend(self) -> str:
        return "cpu"
