"""The Kunlun XPU model runner: the shared runner with the op backend chosen by configuration."""
from __future__ import annotations

from fastdeploy.worker.model_runner_base import ModelRunnerBase


class XPUModelRunner(ModelRunnerBase):
    """`ops_backend` "cpu" runs the ops' C++ CPU path, "xpu3-emulator" the Kunlun3 kernels on the host emulator."""

    device = "xpu"

    @property
    def op_backend(self) -> str:
        return self.config.ops_backend
