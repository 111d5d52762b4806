// kl3::Context: which device a plugin call runs on, plus the status codes and the thread-local last error that
// every plugin function reports through (XPU3_KERNEL_MODEL §9.3, §9.4).
//
// C++11 on purpose: the vendor toolchain compiles wrappers with -std=c++11 (XPU3_KERNEL_MODEL §10).
#pragma once

#include <string>

namespace kl3 {

// Status codes returned by every plugin function (XDNN `Error_t` values, XPU3_KERNEL_MODEL §9.2).
enum Status {
  SUCCESS = 0,
  INVALID_PARAM = 1,
  RUNTIME_ERROR = 2,
  NO_ENOUGH_WORKSPACE = 3,
  NOT_IMPLEMENT = 4,
};

// Device types, numbered as XDNN's DeviceType (CPU = 0, XPU1..XPU4); the project dispatches on kCPU and kXPU3.
enum DeviceType {
  kCPU = 0,
  kXPU3 = 3,
};

// Largest logical cluster count of one launch (XPU3_KERNEL_MODEL §1.2).
const int kMaxLaunchClusters = 255;

// The device a plugin call runs on. `emulated` marks a kXPU3 context whose tensors are host memory and whose
// kernels run on the host emulator (XPU3_KERNEL_MODEL §12). A device context (vendor builds, tensors on an XPU
// place) carries the framework's XPU stream the kernels are launched on, the XDNN `api::Context*` it belongs to
// (opaque here, so the plugin needs no XDNN header) and the device id.
struct Context {
  DeviceType device;
  int ncluster;
  bool emulated;
  void* stream;
  void* xdnn;
  int device_id;

  Context(DeviceType device_type, int ncluster_count, bool is_emulated)
      : device(device_type), ncluster(ncluster_count), emulated(is_emulated), stream(nullptr), xdnn(nullptr),
        device_id(-1) {}

  DeviceType type() const { return device; }

  static Context cpu() { return Context(kCPU, 0, false); }
  static Context emulated_xpu3(int ncluster_count) { return Context(kXPU3, ncluster_count, true); }
  static Context device_xpu3(int ncluster_count, void* xpu_stream, void* xdnn_context, int device) {
    Context ctx(kXPU3, ncluster_count, false);
    ctx.stream = xpu_stream;
    ctx.xdnn = xdnn_context;
    ctx.device_id = device;
    return ctx;
  }
};

// Message of the last failing plugin call on this thread: "<op>: argument '<arg>': <what>". Empty after a
// successful call.
const std::string& last_error();
void set_last_error(const std::string& message);
void clear_last_error();

// Records "<op>: argument '<arg>': <what>" as the last error and returns `status`.
int fail(int status, const char* op, const char* arg, const std::string& what);
// Records "<op>: <what>" (no single argument to blame) as the last error and returns `status`.
int fail_op(int status, const char* op, const std::string& what);

}  // namespace kl3
