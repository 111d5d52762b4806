"""Kunlun3 hardware checks (XPU3_KERNEL_MODEL §14 H6, OPS §8 C1 "Kunlun3 hardware when available").

Runs only where Paddle is built for XPU and a Kunlun device is present; everywhere else every test is skipped
with the reason. The kernels are then the chip's own (vendor build), not the emulator's.
"""

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")


def kunlun_devices() -> int:
    if not paddle.is_compiled_with_xpu():
        return 0
    try:
        return paddle.device.xpu.device_count()
    except (AttributeError, RuntimeError):
        return 0


pytestmark = [
    pytest.mark.xpu,
    pytest.mark.skipif(kunlun_devices() == 0, reason="no Kunlun XPU device (Paddle not built for XPU or no device)"),
]

# Tensors the ops keep on the host on every backend (OPS §2.2).
HOST_TENSORS = {"not_need_stop", "preempted_idx"}


@pytest.mark.parametrize("ncluster", [1, 2, 12])
def test_kernels_match_reference_on_hardware(ncluster):
    """H6: the project's kernels on the chip leave every argument tensor bit-identical to the NumPy reference."""
    from reference.inputs import GENERATORS, gen_inputs, run_reference

    from fastdeploy.model_executor.ops import xpu as ops

    rng = np.random.default_rng(7)
    for op in GENERATORS:
        for seed in range(200):
            B = int(rng.integers(1, 129))
            R = int(rng.integers(1, B + 1))
            T = int(rng.integers(1, 9))
            case = gen_inputs(op, seed, B, R, T)
            expected, expected_result = run_reference(case)
            tensors = {
                k: None if v is None else paddle.to_tensor(
                    v, place=paddle.CPUPlace() if k in HOST_TENSORS else paddle.XPUPlace(0))
                for k, v in case.tensors.items()
            }
            attrs = list(case.attrs.values()) if isinstance(case.attrs, dict) else list(case.attrs)
            # ncluster >= 1 selects the Kunlun3 kernel; with XPU tensors it runs on the device (docs/design.md §1).
            with ops.use_backend("xpu3-emulator", ncluster=ncluster):
                result = getattr(ops, op)(*tensors.values(), *attrs)
            for name, want in expected.items():
                got = None if tensors[name] is None else tensors[name].numpy()
                np.testing.assert_array_equal(got, want, err_msg=f"{op} seed={seed} ncluster={ncluster} {name}")
            if expected_result is not None:
                np.testing.assert_array_equal(result.numpy(), expected_result, err_msg=f"{op} seed={seed}")
