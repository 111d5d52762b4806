"""Native speculative-decoding state ops (OPS.md §5).

* `fastdeploy.model_executor.ops.state_ops` -- the Python entry points over Paddle tensors, every backend (loads
  the op library).
* `fastdeploy.model_executor.ops.xpu` and `.gpu` -- the face FastDeploy code imports: the seven ops of
  `state_ops` under FastDeploy's import paths and names.
* `fastdeploy.model_executor.ops.backend` -- `use_backend`: which backend the ops of a block run on.
* `fastdeploy.model_executor.ops.step_message` -- `decode_step_message` and the step-message constants (pure
  Python/NumPy, no Paddle).
* `fastdeploy.model_executor.ops._kl3_pybind` -- the same ops over NumPy arrays, without Paddle (tests, benchmark).

Importing this package imports nothing else, so framework-free code (the token processor) can import
`step_message` without loading Paddle. The backend names are `fastdeploy.config.OPS_BACKENDS`.
"""
