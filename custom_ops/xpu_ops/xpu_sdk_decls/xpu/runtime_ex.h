// Included by Paddle's XPU headers (paddle/phi/api/include/tensor.h, xpu_header.h); the project uses none of its
// names. Compile-check declarations only (../DECLARATIONS.md).
#pragma once

#include "xpu/runtime.h"
