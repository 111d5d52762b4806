"""The face FastDeploy code imports: `fastdeploy.model_executor.ops.xpu` and `.gpu` expose the seven state ops
under FastDeploy's names with the OPS §5 signatures (tensor arguments in OPS order, then the attributes)."""

import inspect
import subprocess
import sys

import paddle
import pytest

from fastdeploy.model_executor.ops import gpu, op_table, state_ops, xpu

SEVEN = ("speculate_update", "speculate_set_value_by_flags_and_idx", "speculate_set_stop_value_multi_seqs",
         "speculate_schedule_cache", "recover_decode_task", "speculate_clear_accept_nums", "speculate_save_output")


@pytest.mark.parametrize("module", [xpu, gpu], ids=["xpu", "gpu"])
def test_module_exposes_the_seven_ops_with_ops_signatures(module):
    assert sorted(module.__all__) == sorted(SEVEN)
    for name in SEVEN:
        op = getattr(module, name)
        assert op is getattr(state_ops, name)
        sig = op_table.BY_NAME[name]
        expected = list(sig.arg_names) + [attr for attr, _ in sig.attrs]
        assert list(inspect.signature(op).parameters) == expected, name


@pytest.mark.parametrize("path", ["fastdeploy.model_executor.ops.xpu", "fastdeploy.model_executor.ops.gpu"])
def test_fastdeploy_import_line_works_in_a_fresh_interpreter(path):
    """The line a FastDeploy runner has, in its own interpreter (nothing imported before it)."""
    code = f"from {path} import speculate_update, speculate_save_output; print(speculate_update.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "speculate_update"


def test_an_op_imported_from_the_fastdeploy_path_runs():
    """OPS §5.6 through the `.xpu` name: accept_num[b] = 0 where seq_lens_decoder[b] == 0, in place."""
    accept_num = paddle.to_tensor([3, 2, 0, 1], dtype="int32")
    seq_lens_decoder = paddle.to_tensor([0, 5, 0, 7], dtype="int32")
    xpu.speculate_clear_accept_nums(accept_num, seq_lens_decoder)
    assert accept_num.numpy().tolist() == [0, 2, 0, 1]
