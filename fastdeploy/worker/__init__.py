"""Model runners: the shared base and its device subclasses."""
from __future__ import annotations

from fastdeploy.config import FDConfig
from fastdeploy.model_executor.models import Model
from fastdeploy.worker.gpu_model_runner import GPUModelRunner
from fastdeploy.worker.model_runner_base import ModelRunnerBase
from fastdeploy.worker.xpu_model_runner import XPUModelRunner

__all__ = ["ModelRunnerBase", "XPUModelRunner", "GPUModelRunner", "make_runner"]


def make_runner(config: FDConfig, model: Model) -> ModelRunnerBase:
    """The runner class named by config.runner."""
    return {"xpu": XPUModelRunner, "gpu": GPUModelRunner}[config.runner](config, model)
