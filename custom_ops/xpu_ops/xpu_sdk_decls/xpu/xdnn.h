// Minimal declarations of the XDNN names used by the project's XPU branch and by Paddle's XPU headers, for the
// compile-only check (docs/kunlun3.md, "Compile check"). NOT the vendor header; never linked or run. Sources and
// evidence levels: ../DECLARATIONS.md.
#pragma once

#include <stdint.h>

#include "xpu/runtime.h"

// XDNN's half-precision storage types, named unqualified by Paddle's xpu_header.h.
struct float16 {
  uint16_t value;
};
struct bfloat16 {
  uint16_t value;
};

namespace baidu {
namespace xpu {
namespace api {

enum Error_t { SUCCESS = 0, INVALID_PARAM = 1, RUNTIME_ERROR = 2, NO_ENOUGH_WORKSPACE = 3, NOT_IMPLEMENT = 4 };

enum DeviceType { kCPU = 0, kXPU1 = 1, kXPU2 = 2, kXPU3 = 3, kXPU4 = 4 };

class Device {
 public:
  DeviceType type() const;
};

struct Context {
  const Device& dev() const;
  int ncluster() const;
  void set_ncluster(int n);
  XPUStream xpu_stream;
};

Context* create_context();
void destroy_context(Context* ctx);

}  // namespace api
}  // namespace xpu
}  // namespace baidu
