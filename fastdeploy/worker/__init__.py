"""Model runners: the shared base (model_runner_base.py) and its device subclasses."""
from __future__ import annotations


def make_runner(config, model):
    """The runner class named by config.runner ("xpu" or "gpu"), built for `model`. Imported lazily so that
    importing a submodule does not pull in every runner."""
    from fastdeploy.worker.gpu_model_runner import GPUModelRunner
    from fastdeploy.worker.xpu_model_runner import XPUModelRunner
    return {"xpu": XPUModelRunner, "gpu": GPUModelRunner}[config.runner](config, model)
