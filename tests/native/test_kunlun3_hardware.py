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


def vendor_build() -> bool:
    from fastdeploy.model_executor.ops import _kl3_pybind

    return _kl3_pybind.VENDOR_BUILD


pytestmark = [
    pytest.mark.xpu,
    pytest.mark.skipif(kunlun_devices() == 0, reason="no Kunlun XPU device (Paddle not built for XPU or no device)"),
    pytest.mark.skipif(kunlun_devices() > 0 and not vendor_build(),
                       reason="the op extension was built without the vendor toolchain (docs/kunlun3.md)"),
]

# Tensors the ops keep on the host on every backend (OPS §2.2).
HOST_TENSORS = {"not_need_stop", "preempted_idx"}


@pytest.mark.parametrize("ncluster", [1, 2, 12])
def test_kernels_match_reference_on_hardware(ncluster):
    """H6: the project's kernels on the chip leave every argument tensor bit-identical to the NumPy reference."""
    from reference.inputs import GENERATORS, gen_inputs, run_reference

    from fastdeploy.model_executor.ops import state_ops as ops

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
            # XPU tensors: the kernel runs on the device with `ncluster` clusters (docs/kunlun3.md "XPU tensors").
            with ops.use_backend("xpu3", ncluster=ncluster):
                result = getattr(ops, op)(*tensors.values(), *attrs)
            for name, want in expected.items():
                got = None if tensors[name] is None else tensors[name].numpy()
                np.testing.assert_array_equal(got, want, err_msg=f"{op} seed={seed} ncluster={ncluster} {name}")
            if expected_result is not None:
                np.testing.assert_array_equal(result.numpy(), expected_result, err_msg=f"{op} seed={seed}")


def test_mixed_placement_is_refused_naming_the_argument():
    """OPS §2.2: all device tensors of one call on one device; a host tensor among them is a ValueError naming it,
    raised before any side effect."""
    from fastdeploy.model_executor.ops import state_ops as ops

    accept_num = paddle.to_tensor(np.array([3, 0], np.int32), place=paddle.XPUPlace(0))
    seq_lens_decoder = paddle.to_tensor(np.array([0, 0], np.int32), place=paddle.CPUPlace())
    with ops.use_backend("xpu3"), pytest.raises(ValueError, match="argument 'seq_lens_decoder'"):
        ops.speculate_clear_accept_nums(accept_num, seq_lens_decoder)
    np.testing.assert_array_equal(accept_num.numpy(), [3, 0])


def test_pd_mtp_with_the_runner_state_on_the_device_equals_the_cpu_path():
    """PD_MTP_FLOW §10 on the chip: fd-tiny PD + MTP with ops_backend "xpu3" (state tensors on XPU:0) produces the
    single-instance CPU path's tokens."""
    from fastdeploy import LLM, SamplingParams

    prompts = ["On Monday, Judy", "The little dog"]
    params = SamplingParams(temperature=0, max_tokens=16)
    mtp = {"method": "mtp", "num_speculative_tokens": 1}
    want = [o.outputs.token_ids for o in LLM(speculative_config=mtp).generate(prompts, params)]
    got = [o.outputs.token_ids for o in LLM(speculative_config=mtp, splitwise=True,
                                             ops_backend="xpu3").generate(prompts, params)]
    assert got == want
