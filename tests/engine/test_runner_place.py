"""The runner's state on a device place (docs/kunlun3.md): host writes reach the ops' tensors only through
`ShareInputs.push()`, op results reach the host only through `pull()`, and the host results of OPS §2.6 through
`read_not_need_stop()` / `to_host_message()`. Paddle's CPU build has no second place, so a runner whose tensors are
*copies* on the CPU (not views) stands in for a device: every copy the device path makes happens, and the outputs
must stay bit-identical to the zero-copy runner's (PD_MTP_FLOW §10.1)."""

import numpy as np
import paddle

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.step_state import HOST_FIELDS, ShareInputs
from fastdeploy.worker.xpu_model_runner import XPUModelRunner

PROMPTS = ["On Monday, Judy", "The little dog ran", "Once upon a time"]
MTP = {"method": "mtp", "num_speculative_tokens": 2}


class CopyingRunner(XPUModelRunner):
    """Tensors the ops receive are separate copies, as on a device."""

    def shares_host_memory(self) -> bool:
        return False

    def to_device(self, array):
        return paddle.to_tensor(array.copy())


def _generate(llm, runner_cls=None):
    if runner_cls is not None:
        llm.engine.runner = runner_cls(llm.config, llm.model)
    params = SamplingParams(temperature=0, max_tokens=24)
    return [(o.outputs.token_ids, o.outputs.finish_reason) for o in llm.generate(PROMPTS, params)]


def test_copying_state_gives_bit_identical_outputs():
    """PD_MTP_FLOW §10.1 greedy equivalence holds when every stage boundary copies the state explicitly."""
    for backend in ("cpu", "xpu3-emulator"):
        want = _generate(LLM(speculative_config=MTP, ops_backend=backend))
        got = _generate(LLM(speculative_config=MTP, ops_backend=backend), CopyingRunner)
        assert got == want, backend


def test_without_push_the_ops_never_see_host_writes():
    """The copies are real: a host write is invisible to the device tensors until push(), an op result invisible to
    the host until pull(); host fields (OPS §2.2) stay shared."""
    state = ShareInputs.allocate(4, 1, 16, 2, 1, 2, (0,))
    state.attach_views(lambda a: paddle.to_tensor(a.copy()), zero_copy=False)
    state.seq_lens_encoder[2] = 7
    assert state.views.seq_lens_encoder.numpy()[2] == 0
    state.push()
    assert state.views.seq_lens_encoder.numpy()[2] == 7
    state.views.step_idx.set_value(np.full(4, 5, np.int64))
    assert state.step_idx[0] == 0
    state.pull()
    assert (state.step_idx == 5).all()
    for name in HOST_FIELDS:
        getattr(state, name)[0] = 1
        assert getattr(state.views, name).numpy()[0] == 1
    assert state.read_not_need_stop() is True


def test_kv_cache_is_created_on_the_given_place():
    """The runner passes its place to the KV cache when it is not the host (docs/kunlun3.md); the explicit-place
    path yields the same zero layers."""
    from fastdeploy.model_executor.layers.kv_cache import KVCache

    default = KVCache(3, 4, [(2, 5)], "float64")
    placed = KVCache(3, 4, [(2, 5)], "float64", place=paddle.CPUPlace())
    assert placed.layers[0].place.is_cpu_place()
    np.testing.assert_array_equal(placed.layers[0].numpy(), default.layers[0].numpy())
    assert placed.layers[0].dtype == default.layers[0].dtype
