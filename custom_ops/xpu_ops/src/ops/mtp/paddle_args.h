// Paddle adapter of the op layer: paddle::Tensor -> fd_ops::TensorArg, and OpError -> PD_THROW.
//
// XPU places (built with PADDLE_WITH_XPU, i.e. against paddlepaddle-xpu): a tensor on an XPU place carries a
// device binding that takes the place's phi::XPUContext from Paddle's device-context pool, its XDNN context and
// its current stream, so that the wrapper's xpu3_wrapper launches on the stream Paddle orders that tensor's work
// on (docs/kunlun3.md, "XPU tensors"). Without PADDLE_WITH_XPU such tensors are refused as not implemented.
//
// Error text contract (docs/design.md §1): "[kl3-status N] <op>: argument '<arg>': ..."; the ops' Python module
// (python_calls.cc) raises it as RuntimeError (Paddle's own entry as OSError) and state_ops.py maps it to
// ValueError (N = 1) or RuntimeError.
#pragma once

#include <string>

#include "common/op_args.h"
#include "paddle/extension.h"
#include "paddle/phi/core/dense_tensor.h"
#ifdef PADDLE_WITH_XPU
#include "paddle/phi/backends/xpu/xpu_context.h"
#endif

namespace fd_ops {

inline const char* paddle_dtype_name(phi::DataType dtype) {
  switch (dtype) {
    case phi::DataType::BOOL:
      return "bool";
    case phi::DataType::INT8:
      return "int8";
    case phi::DataType::UINT8:
      return "uint8";
    case phi::DataType::INT16:
      return "int16";
    case phi::DataType::INT32:
      return "int32";
    case phi::DataType::INT64:
      return "int64";
    case phi::DataType::FLOAT16:
      return "float16";
    case phi::DataType::BFLOAT16:
      return "bfloat16";
    case phi::DataType::FLOAT32:
      return "float32";
    case phi::DataType::FLOAT64:
      return "float64";
    default:
      return "an unsupported dtype";
  }
}

inline std::string paddle_place_text(const void* handle) {
  return static_cast<const paddle::Tensor*>(handle)->place().DebugString();
}

#ifdef PADDLE_WITH_XPU
// BindDevice for a tensor on an XPU place: the Kunlun3 context of that place as Paddle runs it.
inline bool paddle_xpu_context(const void* handle, int ncluster, kl3::Context* ctx, std::string* error) {
  const phi::Place place = static_cast<const paddle::Tensor*>(handle)->place();
  const auto* dev_ctx =
      static_cast<const phi::XPUContext*>(paddle::experimental::DeviceContextPool::Instance().Get(place));
  if (dev_ctx == nullptr) {
    *error = "Paddle has no device context for " + place.DebugString();
    return false;
  }
  // The kernels are Kunlun3 (XPU3 / P800) code (XPU3_KERNEL_MODEL §10: --xpu-arch=xpu3).
  if (dev_ctx->xpu_version() != phi::backends::xpu::XPUVersion::XPU3) {
    *error = place.DebugString() + " is not a Kunlun3 (XPU3 / P800) device";
    return false;
  }
  baidu::xpu::api::Context* xdnn = dev_ctx->x_context();
  // ncluster 0 on a device: every cluster its XDNN context offers (12 on a P800, XPU3_KERNEL_MODEL §1.1).
  const int clusters = ncluster > 0 ? ncluster : xdnn->ncluster();
  *ctx = kl3::Context::device_xpu3(clusters, dev_ctx->stream(), xdnn, place.GetDeviceId());
  return true;
}
#endif

inline PlaceKind paddle_place_kind(const phi::Place& place) {
  switch (place.GetType()) {
    case phi::AllocationType::CPU:
      return PlaceKind::kHost;
    case phi::AllocationType::XPU:
      return PlaceKind::kXPU;
    default:
      return PlaceKind::kOther;
  }
}

// Fills the metadata fields of `a` (the dtype is mapped to the op layer's kinds; other dtypes keep only a name).
inline void set_metadata(TensorArg& a, phi::DataType dtype, const phi::DDim& dims, int64_t numel, const void* data,
                         const phi::Place& place, bool contiguous) {
  int64_t item = 0;
  if (dtype == phi::DataType::BOOL) {
    a.dtype = DType::kBool;
    item = 1;
  } else if (dtype == phi::DataType::INT32) {
    a.dtype = DType::kInt32;
    item = 4;
  } else if (dtype == phi::DataType::INT64) {
    a.dtype = DType::kInt64;
    item = 8;
  }
  a.dtype_name = paddle_dtype_name(dtype);
  // Ranks above 8 never match an op's form; keeping the first 8 dims is enough for the message.
  a.rank = dims.size() < 8 ? dims.size() : 8;
  for (int i = 0; i < a.rank; ++i) {
    a.dims[i] = dims[i];
  }
  a.data = const_cast<void*>(data);
  a.nbytes = numel * item;
  a.place = paddle_place_kind(place);
  if (a.place != PlaceKind::kHost) {
    a.device_id = place.GetDeviceId();
  }
#ifdef PADDLE_WITH_XPU
  if (a.place == PlaceKind::kXPU) {
    a.bind_device = paddle_xpu_context;
  }
#endif
  a.contiguous = contiguous;
}

// A tensor passed as None arrives undefined; it becomes an absent argument (rejected unless optional).
inline TensorArg to_arg(const paddle::Tensor& t) {
  TensorArg a;
  if (!t.defined()) {
    return a;
  }
  a.present = true;
  a.handle = &t;
  a.place_text = paddle_place_text;
  if (t.is_dense_tensor()) {
    // Every tensor the Python entry passes: read through phi::DenseTensor directly, one type check instead of one
    // per paddle::Tensor accessor (this runs for each of an op's 2-14 tensors on every call).
    const auto& dense = *static_cast<const phi::DenseTensor*>(t.impl().get());
    const int64_t numel = dense.numel();
    set_metadata(a, dense.dtype(), dense.dims(), numel, numel > 0 ? dense.data() : nullptr,
                 dense.place(), dense.meta().is_contiguous());
  } else {
    // Not a plain buffer (e.g. a sparse tensor): described through the generic accessors, rejected by layout().
    const int64_t numel = t.numel();
    set_metadata(a, t.dtype(), t.dims(), numel, nullptr, t.place(), false);
  }
  return a;
}

[[noreturn]] inline void throw_paddle(const OpError& e) {
  PD_THROW("[kl3-status ", e.status(), "] ", e.message());
}

}  // namespace fd_ops
