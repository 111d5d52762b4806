// fastdeploy.model_executor.ops._paddle_ops as a Python module: each registered op's kernel function (and each
// dispatch floor's) as a function of the registered name, which the Python entry (state_ops.py) calls instead of
// `paddle._C_ops._run_custom_op`. Same arguments, checks, in-place writes and outputs as the registered op; what
// differs is the call's cost: Paddle 3.3's eager `_run_custom_op` copies the metadata of every custom op the
// process has registered on every call (custom_ops/cpu_ops/python_calls.cc, docs/benchmarks.md "Ops latency").
// The Python entry refuses non-contiguous tensors before the call (Paddle's entry would hand the op a copy, losing
// its in-place writes). The kernels run without the GIL, as Paddle's ops do. On Kunlun the tensors' XPU places
// reach the op layer as through Paddle's entry (mtp/paddle_args.h takes the device context from Paddle's pool).
#include "mtp/op_signatures.h"
#include "paddle/utils/pybind.h"

PYBIND11_MODULE(_paddle_ops, m) {
  namespace py = pybind11;
  m.doc() = "The state ops' kernels called directly (custom_ops/xpu_ops/src/ops/mtp/python_calls.cc), by their "
            "registered names; the arguments are the registered op's inputs then attributes.";
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("speculate_update", &SpeculateUpdate, no_gil);
  m.def("speculate_set_value_by_flags_and_idx", &SpeculateSetValueByFlagsAndIdx, no_gil);
  m.def("speculate_set_stop_value_multi_seqs", &SpeculateSetStopValueMultiSeqs, no_gil);
  m.def("speculate_schedule_cache", &SpeculateScheduleCache, no_gil);
  m.def("recover_decode_task", &RecoverDecodeTask, no_gil);
  m.def("recover_spec_decode_task", &RecoverSpecDecodeTask, no_gil);
  m.def("speculate_clear_accept_nums", &SpeculateClearAcceptNums, no_gil);
  m.def("speculate_save_output", &SpeculateSaveOutput, no_gil);
  m.def("fd_dispatch_floor", &fd_floor::DispatchFloor, no_gil);
  m.def("fd_dispatch_floor_speculate_update", &fd_floor::Update, no_gil);
  m.def("fd_dispatch_floor_speculate_set_value_by_flags_and_idx", &fd_floor::SetValue, no_gil);
  m.def("fd_dispatch_floor_speculate_set_stop_value_multi_seqs", &fd_floor::SetStop, no_gil);
  m.def("fd_dispatch_floor_speculate_schedule_cache", &fd_floor::Schedule, no_gil);
  m.def("fd_dispatch_floor_recover_decode_task", &fd_floor::Recover, no_gil);
  m.def("fd_dispatch_floor_recover_spec_decode_task", &fd_floor::RecoverSpec, no_gil);
  m.def("fd_dispatch_floor_speculate_clear_accept_nums", &fd_floor::Clear, no_gil);
  m.def("fd_dispatch_floor_speculate_save_output", &fd_floor::Save, no_gil);
}
