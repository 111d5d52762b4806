// Paddle op fd_dispatch_floor: one int32 tensor in place plus the trailing `ncluster` attribute, does nothing.
// The latency benchmark's dispatch floor: the cost of calling a custom op the way the state ops are called.
#include "paddle/extension.h"

void FdDispatchFloor(paddle::Tensor& x, int ncluster) {}

PD_BUILD_OP(fd_dispatch_floor)
    .Inputs({"x"})
    .Outputs({"x_out"})
    .Attrs({"ncluster: int"})
    .SetInplaceMap({{"x", "x_out"}})
    .SetKernelFn(PD_KERNEL(FdDispatchFloor));
