"""The Kunlun XPU model runner: the shared runner with the op backend chosen by configuration."""
from __future__ import annotations

import paddle

from fastdeploy.worker.model_runner_base import ModelRunnerBase


class XPUModelRunner(ModelRunnerBase):
    """`ops_backend` "cpu" runs the ops' C++ CPU path, "xpu3-emulator" the Kunlun3 kernels on the host emulator,
    "xpu3" the kernels on Kunlun device 0 with the state tensors there."""

    def resolve_place(self) -> paddle.CPUPlace | paddle.XPUPlace:
        if self.config.ops_backend != "xpu3":
            return paddle.CPUPlace()
        if not paddle.is_compiled_with_xpu():
            raise ValueError("FDConfig: field 'ops_backend': 'xpu3' needs paddlepaddle-xpu and a Kunlun device "
                             "(this paddle is not compiled with XPU)")
        return paddle.XPUPlace(0)

    @property
    def op_backend(self) -> str:
        return self.config.ops_backend
