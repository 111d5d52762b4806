// Host side of a Kunlun3 kernel launch, identical in wrapper code for both builds (XPU3_KERNEL_MODEL §9.4 item 5):
//   KL3_KERNEL_DECL          spelling of a kernel declaration in a wrapper
//   KL3_GM_TENSOR(p, numel)  declares a device tensor the next launch may touch (emulator bounds checks)
//   KL3_LAUNCH(kernel, ncluster, ncore, stream, args...)  -> int status, 0 on success
//   kl3dev::alloc / copy_to_host / copy_to_device / release  small device buffers (not_need_stop, OPS §6; probes)
//   kl3dev::launch_error()   text describing a failed launch
//   kl3dev::int64, kl3dev::i64(p)  the kernels' spelling of int64_t and the pointer conversion to it
// Vendor builds (KL3_VENDOR_BUILD, set by CMake and setup.py when the Kunlun SDK is found) expand to `<<<...>>>`
// and XRE calls; every other build runs the kernel on the host emulator. C++11 in the vendor branch.
// KL3_COMPILE_CHECK (with KL3_VENDOR_BUILD) is the compile-only check of the vendor branch with g++, which cannot
// parse `<<<...>>>`: a launch becomes a call that type-checks the arguments against the kernel declaration and
// is never run (docs/kunlun3.md, "Compile check").
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef KL3_VENDOR_BUILD

#include "xpu/runtime.h"

#define KL3_GM_TENSOR(ptr, numel) ((void)0)

#ifdef KL3_COMPILE_CHECK
namespace kl3dev {
// The launch's arguments must convert to the kernel's parameters exactly as `<<<...>>>` requires.
template <typename... Params, typename... Args>
int checked_launch(void (*kernel)(Params...), int ncluster, int ncore, XPUStream stream, Args&&... args) {
  (void)kernel;
  (void)ncluster;
  (void)ncore;
  (void)stream;
  (void)sizeof...(args);
  static_assert(sizeof...(Params) == sizeof...(Args), "KL3_LAUNCH: argument count differs from the kernel's");
  return sizeof(kernel(static_cast<Args&&>(args)...), 0) == 0 ? 1 : 0;
}
}  // namespace kl3dev
#define KL3_KERNEL_DECL
#define KL3_LAUNCH(kernel, ncluster, ncore, stream, ...) \
  ::kl3dev::checked_launch(&kernel, (ncluster), (ncore), static_cast<XPUStream>(stream), __VA_ARGS__)
#else
#define KL3_KERNEL_DECL __attribute__((global))
#define KL3_LAUNCH(kernel, ncluster, ncore, stream, ...) \
  kernel<<<(ncluster), (ncore), static_cast<XPUStream>(stream)>>>(__VA_ARGS__)
#endif

namespace kl3dev {
// int64_t is `long long` on the device but `long` on an x86-64 host, so kernel declarations in host code spell it
// `long long` and int64 pointers are converted at the launch (XPU3_KERNEL_MODEL §4.3, XDNN XPUIndexType).
typedef long long int64;

inline int alloc(void** ptr, std::size_t bytes) { return xpu_malloc(ptr, static_cast<uint64_t>(bytes)); }
inline int copy_to_host(void* host_dst, const void* dev_src, std::size_t bytes, void* stream) {
  int ret = xpu_wait(static_cast<XPUStream>(stream));
  if (ret != 0) return ret;
  return xpu_memcpy(host_dst, dev_src, static_cast<uint64_t>(bytes), XPU_DEVICE_TO_HOST);
}
inline int copy_to_device(void* dev_dst, const void* host_src, std::size_t bytes) {
  return xpu_memcpy(dev_dst, host_src, static_cast<uint64_t>(bytes), XPU_HOST_TO_DEVICE);
}
inline void release(void* ptr) { xpu_free(ptr); }
inline const char* launch_error() { return "XRE reported a kernel launch failure"; }
}  // namespace kl3dev

#else  // host emulator

#include <cstdlib>
#include <cstring>

#include "kl3_emu_runtime.h"

#define KL3_KERNEL_DECL
#define KL3_GM_TENSOR(ptr, numel) \
  ::kl3emu::register_gm((ptr), static_cast<std::size_t>(numel) * sizeof(*(ptr)))
#define KL3_LAUNCH(kernel, ncluster, ncore, stream, ...) \
  ((void)(stream), ::kl3emu::launch(#kernel, (ncluster), (ncore), &kernel, __VA_ARGS__))

namespace kl3dev {
// Emulated kernels are host code: their int64_t is the host's (XPU3_KERNEL_MODEL §12.1 Types).
typedef int64_t int64;

inline int alloc(void** ptr, std::size_t bytes) {
  *ptr = std::malloc(bytes);
  return *ptr == nullptr ? 1 : 0;
}
inline int copy_to_host(void* host_dst, const void* dev_src, std::size_t bytes, void* /*stream*/) {
  std::memcpy(host_dst, dev_src, bytes);
  return 0;
}
inline int copy_to_device(void* dev_dst, const void* host_src, std::size_t bytes) {
  std::memcpy(dev_dst, host_src, bytes);
  return 0;
}
inline void release(void* ptr) { std::free(ptr); }
inline const char* launch_error() { return ::kl3emu::last_launch_error(); }
}  // namespace kl3dev

#endif  // KL3_VENDOR_BUILD

namespace kl3dev {
inline int64* i64(int64_t* p) { return reinterpret_cast<int64*>(p); }
inline const int64* i64(const int64_t* p) { return reinterpret_cast<const int64*>(p); }
}  // namespace kl3dev
