"""Each op's signature is defined once (fastdeploy/model_executor/ops/op_table.py); the Python entry
reads it and the other faces -- plugin.h, the op layer, the Paddle registrations with their in-place maps
(OPS §2.5) and their Python bindings, and pybind -- are checked against it at build time. Drift in any face is
reported."""

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from fastdeploy.model_executor.ops import op_table

XPU_OPS = Path(__file__).resolve().parents[2] / "custom_ops" / "xpu_ops"


def _checker():
    spec = importlib.util.spec_from_file_location("check_op_signatures", XPU_OPS / "tools" / "check_op_signatures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_face_matches_the_table():
    """OPS §5 names and order, OPS §2.5 in-place maps: no drift in the tree as built."""
    assert _checker().check() == []


def test_python_entry_takes_its_argument_names_from_the_table():
    from fastdeploy.model_executor.ops import state_ops as ops

    assert ops._OP_ARGS.keys() == op_table.BY_NAME.keys()
    for name, args in ops._OP_ARGS.items():
        assert args == op_table.arg_names(name)


MUTATIONS = [
    # (file under src/, old text, new text, expected words in the report)
    ("plugin/include/xpu/plugin.h", "const int32_t* accept_num,         // [B]\n                     const bool* stop_flags",
     "const int32_t* accept_nums,        // [B]\n                     const bool* stop_flags", "plugin.h: speculate_update"),
    ("plugin/include/xpu/plugin.h", "                                int32_t* accept_num,              // [B]",
     "                                const int32_t* accept_num,        // [B]", "argument 'accept_num'"),
    ("ops/common/mtp_calls.cc", '{"step_idx", kI64, kVec, kDev, kR},\n  };', '{"step_idx", kI64, kVec, kDev, kW},\n  };',
     "mtp_calls.cc: speculate_set_value_by_flags_and_idx"),
    ("ops/mtp/op_signatures.h", '{"accept_num", "accept_num_out"},', '', "in-place map"),
    ("ops/mtp/python_calls.cc", 'm.def("speculate_clear_accept_nums", ', 'm.def("speculate_clear_accept_num", ',
     "python_calls.cc: speculate_clear_accept_nums"),
    ("ops/pybind/pybind.cc", 'numpy_arg(step_draft_tokens, op, "step_draft_tokens", true)',
     'numpy_arg(step_draft_tokens, op, "step_draft_tokens")', "pybind.cc: recover_decode_task"),
]


@pytest.mark.parametrize("path, old, new, expected", MUTATIONS, ids=[m[3] for m in MUTATIONS])
def test_a_drift_in_one_face_is_reported(tmp_path, path, old, new, expected):
    """The check can fail: one edit in one face is reported with the face and the op or argument."""
    src = tmp_path / "src"
    shutil.copytree(XPU_OPS / "src", src)
    target = src / path
    text = target.read_text()
    assert old in text, f"mutation anchor missing in {path}"
    target.write_text(text.replace(old, new, 1))
    problems = _checker().check(src)
    assert problems and any(expected in p for p in problems), problems


def test_the_engines_slot_limit_is_the_kernels():
    """config.MAX_NUM_SEQS (SchedulerConfig's bound on max_num_seqs) is plugin.h's kSpeculateUpdateMaxSlots."""
    import re

    from fastdeploy.config import MAX_NUM_SEQS

    header = (XPU_OPS / "src" / "plugin" / "include" / "xpu" / "plugin.h").read_text()
    (value,) = re.findall(r"const int kSpeculateUpdateMaxSlots = (\d+);", header)
    assert int(value) == MAX_NUM_SEQS
