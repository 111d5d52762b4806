// The CUDA-compatible names of XRE that Paddle's XPU headers use (xpu_info.h, xpu_cuda_stream.h, enforce_xpu.h,
// context_pool.h). The project itself uses none of them. Compile-check declarations only (../DECLARATIONS.md).
#pragma once

extern "C" {

typedef struct XreStreamOpaque* cudaStream_t;
typedef struct XreEventOpaque* cudaEvent_t;
enum cudaError_t { cudaSuccess = 0, cudaErrorNotReady = 600 };
struct cudaDeviceProp {
  char name[256];
};

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);

}  // extern "C"
