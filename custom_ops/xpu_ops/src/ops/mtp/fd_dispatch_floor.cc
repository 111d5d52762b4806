// Paddle ops of the latency benchmark's dispatch floors; every kernel here does nothing.
//
// fd_dispatch_floor: one int32 tensor in place plus the trailing `ncluster` attribute -- the cost of calling any
// custom op the way the state ops are called.
// fd_dispatch_floor_<op>: the same inputs, outputs, in-place map and attributes as the registered op <op> -- the
// cost Paddle's dispatch alone charges for that op's signature, so that op / floor measures the project's own
// layers (Python entry, op layer checks, plugin).
#include <vector>

#include "paddle/extension.h"
#include "mtp/op_signatures.h"

namespace fd_floor {

using T = paddle::Tensor;

void DispatchFloor(T&, int) {}

void Update(T&, T&, T&, T&, T&, const T&, const T&, const T&, const T&, const T&, T&, int) {}

void SetValue(T&, const T&, T&, const T&, const T&, const T&, T&, const T&, int) {}

void SetStop(T&, T&, const T&, const T&, T&, const T&, const T&, const T&, const T&, const T&, int) {}

void Schedule(const T&, const T&, T&, const T&, T&, T&, T&, T&, T&, T&, T&, T&, T&, T&, int, int, bool, int) {}

void Recover(T&, T&, T&, T&, const T&, const T&, T&, int, int, int) {}

void RecoverSpec(T&, T&, T&, T&, const T&, const T&, T&, T&, const T&, const T&, int, int, int) {}

void Clear(T&, const T&, int) {}

// The real op returns a new message tensor; an empty one keeps the output without the op's allocation.
std::vector<T> Save(const T&, const T&, const T&, const T&, const T&, T&, int, bool, bool, int) {
  return {paddle::empty({0}, paddle::DataType::INT64, paddle::CPUPlace())};
}

}  // namespace fd_floor

PD_BUILD_OP(fd_dispatch_floor)
    .Inputs({"x"})
    .Outputs({"x_out"})
    .Attrs({"ncluster: int"})
    .SetInplaceMap({{"x", "x_out"}})
    .SetKernelFn(PD_KERNEL(fd_floor::DispatchFloor));

PD_BUILD_OP(fd_dispatch_floor_speculate_update)
    SPECULATE_UPDATE_SIGNATURE
    .SetKernelFn(PD_KERNEL(fd_floor::Update));

PD_BUILD_OP(fd_dispatch_floor_speculate_set_value_by_flags_and_idx)
    SPECULATE_SET_VALUE_BY_FLAGS_AND_IDX_SIGNATURE
    .SetKernelFn(PD_KERNEL(fd_floor::SetValue));

PD_BUILD_OP(fd_dispatch_floor_speculate_set_stop_value_multi_seqs)
    SPECULATE_SET_STOP_VALUE_MULTI_SEQS_SIGNATURE
    .SetKernelFn(PD_KERNEL(fd_floor::SetStop));

PD_BUILD_OP(fd_dispatch_floor_speculate_schedule_cache)
    SPECULATE_SCHEDULE_CACHE_SIGNATURE
    .SetKernelFn(PD_KERNEL(fd_floor::Schedule));

PD_BUILD_OP(fd_dispatch_floor_recover_decode_task)
    RECOVER_DECODE_TASK_SIGNATURE
    .SetKernelFn(PD_KERNEL(fd_floor::Recover));

PD_BUILD_OP(fd_dispatch_floor_recover_spec_decode_task)
    RECOVER_SPEC_DECODE_TASK_SIGNATURE
    .SetKernelFn(PD_KERNEL(fd_floor::RecoverSpec));

PD_BUILD_OP(fd_dispatch_floor_speculate_clear_accept_nums)
    SPECULATE_CLEAR_ACCEPT_NUMS_SIGNATURE
    .SetKernelFn(PD_KERNEL(fd_floor::Clear));

PD_BUILD_OP(fd_dispatch_floor_speculate_save_output)
    SPECULATE_SAVE_OUTPUT_SIGNATURE
    .SetKernelFn(PD_KERNEL(fd_floor::Save));

