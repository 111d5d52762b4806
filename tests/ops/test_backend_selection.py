"""Backend selection (docs/design.md §1, OPS §9.1): `use_backend` is a context manager over a ContextVar, so the
choice is scoped to the block, restored on exit (also after an exception), and validated at the call."""

import pytest

from .harness import ops_module


def test_use_backend_is_scoped_to_its_block_and_restored_after_an_exception():
    ops = ops_module()
    assert ops.current_backend() == "cpu"
    with ops.use_backend("xpu3-emulator", ncluster=2):
        assert ops.current_backend() == "xpu3-emulator"
        with ops.use_backend("cpu"):
            assert ops.current_backend() == "cpu"
        assert ops.current_backend() == "xpu3-emulator"
    assert ops.current_backend() == "cpu"
    with pytest.raises(KeyError):
        with ops.use_backend("xpu3-emulator"):
            raise KeyError("inside the block")
    assert ops.current_backend() == "cpu"


@pytest.mark.parametrize("name, ncluster, match", [
    ("gpu", 12, "unknown backend 'gpu'"),
    ("xpu3-emulator", 0, r"ncluster must be an int in \[1, 255\]"),
    ("xpu3-emulator", 256, r"ncluster must be an int in \[1, 255\]"),
    ("xpu3-emulator", True, r"ncluster must be an int"),
])
def test_use_backend_rejects_bad_arguments_at_the_call(name, ncluster, match):
    ops = ops_module()
    with pytest.raises(ValueError, match=match):
        ops.use_backend(name, ncluster=ncluster)
    assert ops.current_backend() == "cpu"


def test_device_backend_is_refused_without_paddle_xpu():
    """docs/kunlun3.md "XPU tensors": 'xpu3' means XPU-place tensors; on a CPU-only paddle it is refused rather than
    silently running the emulator."""
    import paddle

    if paddle.is_compiled_with_xpu():
        pytest.skip("paddle is compiled with XPU here")
    with pytest.raises(ValueError, match="'xpu3' needs paddlepaddle-xpu"):
        ops_module().use_backend("xpu3")
