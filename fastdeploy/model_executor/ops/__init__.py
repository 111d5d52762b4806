"""Native speculative-decoding state ops (OPS.md §5).

* `fastdeploy.model_executor.ops.xpu` -- the Python entry points over Paddle CPU tensors (loads the op library).
* `fastdeploy.model_executor.ops.step_message` -- `decode_step_message` and the step-message constants (pure
  Python/NumPy, no Paddle).
* `fastdeploy.model_executor.ops._kl3_pybind` -- the same ops over NumPy arrays, without Paddle (tests, benchmark).

Importing this package imports nothing else, so configuration code (which must not import Paddle) can read the
backend names from here.
"""

# Op backends selectable with `xpu.use_backend` (docs/design.md §1): the C++ CPU path, the Kunlun3 kernels on
# the host emulator, or the Kunlun3 kernels on a Kunlun device (XPU-place tensors; paddlepaddle-xpu).
BACKENDS = ("cpu", "xpu3-emulator", "xpu3")
