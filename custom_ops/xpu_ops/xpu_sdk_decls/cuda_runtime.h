// XRE CUDA-compatibility header as Paddle includes it; declarations in xre/cuda_runtime_api.h.
#pragma once

#include "xre/cuda_runtime_api.h"
