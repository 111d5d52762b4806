// Paddle op fd_dispatch_floor: one int32 tensor in place, does nothing. The benchmark's dispatch floor: the
// cost of calling a custom op with the same calling convention as the state ops.
#include "paddle/extension.h"

void FdDispatchFloor(paddle::Tensor& x) {}

PD_BUILD_OP(fd_dispatch_floor)
    .Inputs({"x"})
    .Outputs({"x_out"})
    .SetInplaceMap({{"x", "x_out"}})
    .SetKernelFn(PD_KERNEL(FdDispatchFloor));
