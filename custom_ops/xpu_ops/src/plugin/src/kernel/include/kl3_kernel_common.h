// Device helpers shared by the project's Kunlun3 kernels: the project `partition` (XPU3_KERNEL_MODEL §2.1),
// exact-size scalar loads/stores and chunked int64 row moves through a fixed LM buffer (OPS §6).
// C++11, `static inline`, identical in the vendor and the emulator builds (XPU3_KERNEL_MODEL §10, §13).
#pragma once

#include "xpu/kernel/cluster.h"

#ifndef KL3_EMULATION
// Vendor spellings of the project's memory macros; the emulator defines its own in kl3_emu.h.
#define KL3_SHARED(type, name, count) __shared__ type name[count]
#define KL3_LOCAL(type, name, count) type name[count]
#endif

namespace fd_xpu {
namespace kernel {

// Width of the LM chunk that int64 rows of any width move through: 32 int64 = 256 bytes (OPS §6).
static const int kRowChunk = 32;

// Splits `len` elements, in blocks of `align`, over `nthreads` threads: thread `tid` gets the half-open range
// [*start, *end); threads without work get *start == *end (XPU3_KERNEL_MODEL §2.1).
template <typename TID>
static inline __device__ void partition(int tid, int nthreads, TID len, int align, TID* start, TID* end) {
  const TID blocks = (len + align - 1) / align;
  const TID base = blocks / nthreads;
  const TID rem = blocks % nthreads;
  const TID t = static_cast<TID>(tid);
  const TID first_block = base * t + (t < rem ? t : rem);
  const TID end_block = first_block + base + (t < rem ? 1 : 0);
  const TID s = first_block * align;
  const TID e = end_block * align;
  *start = s < len ? s : len;
  *end = e < len ? e : len;
}

// Global thread index and thread count for per-slot work strided over every core of every cluster (OPS §6).
static inline __device__ int global_thread() { return cluster_id() * core_num() + core_id(); }
static inline __device__ int global_threads() { return cluster_num() * core_num(); }

// One element GM -> LM / LM -> GM, exactly sizeof(T) bytes (XPU3_KERNEL_MODEL §5 project rules).
template <typename T>
static inline __device__ T load_gm(__global_ptr__ const T* src) {
  T value;
  GM2LM(src, &value, static_cast<int>(sizeof(T)));
  return value;
}

template <typename T>
static inline __device__ void store_gm(__global_ptr__ T* dst, T value) {
  LM2GM(&value, dst, static_cast<int>(sizeof(T)));
}

// bool tensors are read as one byte, nonzero meaning true, and written as exactly 0 or 1 (OPS §2.1).
static inline __device__ bool load_flag(__global_ptr__ const bool* src) {
  unsigned char byte;
  GM2LM(src, &byte, 1);
  return byte != 0;
}

static inline __device__ void store_flag(__global_ptr__ bool* dst, bool value) {
  unsigned char byte = value ? 1 : 0;
  LM2GM(&byte, dst, 1);
}

// dst[0, n) = src[0, n) for int64 rows of any width, through one LM chunk.
static inline __device__ void copy_row_i64(__global_ptr__ const int64_t* src, __global_ptr__ int64_t* dst, int n) {
  KL3_LOCAL(int64_t, chunk, kRowChunk);
  for (int off = 0; off < n; off += kRowChunk) {
    const int len = n - off < kRowChunk ? n - off : kRowChunk;
    const int bytes = len * static_cast<int>(sizeof(int64_t));
    GM2LM(src + off, chunk, bytes);
    LM2GM(chunk, dst + off, bytes);
  }
}

// dst[0, n) = value for int64 rows of any width, through one LM chunk.
static inline __device__ void fill_row_i64(__global_ptr__ int64_t* dst, int n, int64_t value) {
  KL3_LOCAL(int64_t, chunk, kRowChunk);
  for (int i = 0; i < kRowChunk; ++i) chunk[i] = value;
  for (int off = 0; off < n; off += kRowChunk) {
    const int len = n - off < kRowChunk ? n - off : kRowChunk;
    LM2GM(chunk, dst + off, len * static_cast<int>(sizeof(int64_t)));
  }
}

}  // namespace kernel
}  // namespace fd_xpu
