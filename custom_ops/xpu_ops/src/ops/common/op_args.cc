// Metadata checks of op arguments; see op_args.h for the order.
#include "common/op_args.h"

#include <utility>

namespace fd_ops {

namespace {

const char* dtype_text(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return "bool";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    default:
      return "unknown";
  }
}

// Every tensor's element count must be < 2^31 (OPS §2.2): kernels index with 32-bit arithmetic.
const int64_t kMaxElements = (int64_t{1} << 31) - 1;

std::string place_of(const TensorArg& a) {
  return a.place_text ? a.place_text(a.handle) : std::string("unknown place");
}

}  // namespace

int64_t TensorArg::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    n *= dims[i];
  }
  return n;
}

std::string TensorArg::shape_text() const {
  std::string text = "[";
  for (int i = 0; i < rank; ++i) {
    text += (i ? ", " : "") + std::to_string(dims[i]);
  }
  return text + "]";
}

OpError::OpError(int status, std::string message) : status_(status), message_(std::move(message)) {}

OpCheck::OpCheck(const char* op, const ArgSpec* specs, const TensorArg* const* args, int count)
    : op_(op), specs_(specs), args_(args), count_(count) {}

void OpCheck::fail(const char* arg, const std::string& what, int status) const {
  throw OpError(status, std::string(op_) + ": argument '" + arg + "': " + what);
}

void OpCheck::dtypes() const {
  for (int i = 0; i < count_; ++i) {
    const TensorArg& a = *args_[i];
    if (!a.present && !specs_[i].optional) {
      fail(specs_[i].name, "expected a tensor (got None)");
    }
    if (a.present && a.dtype != specs_[i].dtype) {
      fail(specs_[i].name, std::string("expected dtype ") + dtype_text(specs_[i].dtype) + " (got " + a.dtype_name +
                               ")");
    }
  }
}

void OpCheck::forms() const {
  for (int i = 0; i < count_; ++i) {
    const TensorArg& a = *args_[i];
    if (!a.present) {
      continue;
    }
    const char* name = specs_[i].name;
    switch (specs_[i].form) {
      case Form::kVector:
        if (!(a.rank == 1 || (a.rank == 2 && a.dims[1] == 1))) {
          fail(name, "expected a per-slot vector of shape [N] or [N, 1] (got " + a.shape_text() + ")");
        }
        break;
      case Form::kFlag:
        if (a.numel() != 1) {
          fail(name, "expected exactly one element (got shape " + a.shape_text() + ")");
        }
        break;
      case Form::kMatrix:
        if (a.rank != 2) {
          fail(name, "expected a 2-D tensor (got shape " + a.shape_text() + ")");
        }
        break;
      case Form::kTensor3:
        if (a.rank != 3) {
          fail(name, "expected a 3-D tensor (got shape " + a.shape_text() + ")");
        }
        break;
    }
  }
}

void OpCheck::placement() const {
  // The dispatch device is the place of the first device argument: every other device argument must be on the same
  // device (same kind, same index), and host arguments must be host tensors whatever the backend (OPS §2.2).
  dispatch_ = -1;
  for (int i = 0; i < count_; ++i) {
    const TensorArg& a = *args_[i];
    if (!a.present) {
      continue;
    }
    if (specs_[i].where == Where::kHost) {
      if (a.place != PlaceKind::kHost) {
        fail(specs_[i].name, "expected a host (CPU) tensor (got " + place_of(a) + ")");
      }
      continue;
    }
    if (dispatch_ < 0) {
      dispatch_ = i;
      continue;
    }
    const TensorArg& first = *args_[dispatch_];
    if (a.place != first.place || (a.place != PlaceKind::kHost && a.device_id != first.device_id)) {
      fail(specs_[i].name, "expected the same device as '" + std::string(specs_[dispatch_].name) + "' (" +
                               place_of(first) + "; got " + place_of(a) + ")");
    }
  }
  if (dispatch_ < 0 || args_[dispatch_]->place == PlaceKind::kHost) {
    return;
  }
  const TensorArg& a = *args_[dispatch_];
  if (a.place != PlaceKind::kXPU) {
    fail(specs_[dispatch_].name, "tensors on " + place_of(a) + " are not supported (host or Kunlun XPU tensors only)",
         kl3::NOT_IMPLEMENT);
  }
  if (a.bind_device == nullptr) {
    fail(specs_[dispatch_].name,
         "tensors on " + place_of(a) + " are not supported by this build (built without PADDLE_WITH_XPU)",
         kl3::NOT_IMPLEMENT);
  }
}

void OpCheck::layout() const {
  for (int i = 0; i < count_; ++i) {
    const TensorArg& a = *args_[i];
    if (!a.present) {
      continue;
    }
    if (!a.contiguous) {
      fail(specs_[i].name, "expected a contiguous (row-major) tensor");
    }
    if (specs_[i].access == Access::kWrite && !a.writable) {
      fail(specs_[i].name, "expected a writable tensor (the op modifies it in place)");
    }
  }
}

void OpCheck::storage() const {
  // Two arguments must not share storage (OPS §2.2): report the later one of an overlapping pair.
  for (int i = 0; i < count_; ++i) {
    const TensorArg& a = *args_[i];
    if (!a.present || a.nbytes == 0) {
      continue;
    }
    const char* a_begin = static_cast<const char*>(a.data);
    for (int j = 0; j < i; ++j) {
      const TensorArg& b = *args_[j];
      if (!b.present || b.nbytes == 0) {
        continue;
      }
      const char* b_begin = static_cast<const char*>(b.data);
      if (a_begin < b_begin + b.nbytes && b_begin < a_begin + a.nbytes) {
        fail(specs_[i].name, std::string("shares storage with '") + specs_[j].name + "'");
      }
    }
  }
}

void OpCheck::element_counts() const {
  for (int i = 0; i < count_; ++i) {
    const TensorArg& a = *args_[i];
    if (a.present && a.numel() > kMaxElements) {
      fail(specs_[i].name, std::to_string(a.numel()) + " elements exceed the supported maximum of 2^31 - 1");
    }
  }
}

void OpCheck::numel_is(int i, int64_t expected, const char* what) const {
  const TensorArg& a = *args_[i];
  if (a.present && a.numel() != expected) {
    fail(specs_[i].name, "expected " + std::to_string(expected) + " elements, " + what + " (got shape " +
                             a.shape_text() + ")");
  }
}

void OpCheck::dims_are(int i, int64_t rows, int64_t cols) const {
  const TensorArg& a = *args_[i];
  if (a.present && (a.dims[0] != rows || a.dims[1] != cols)) {
    fail(specs_[i].name, "expected shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "] (got " +
                             a.shape_text() + ")");
  }
}

void OpCheck::dim_at_least(int i, int axis, int64_t minimum, const char* what) const {
  const TensorArg& a = *args_[i];
  if (a.present && a.dims[axis] < minimum) {
    fail(specs_[i].name, std::string("expected ") + what + " >= " + std::to_string(minimum) + " (got shape " +
                             a.shape_text() + ")");
  }
}

void OpCheck::at_least(const char* arg, int64_t value, int64_t minimum, const char* what) const {
  if (value < minimum) {
    fail(arg, std::string("expected ") + what + " >= " + std::to_string(minimum) + " (got " + std::to_string(value) +
                  ")");
  }
}

void OpCheck::between(const char* arg, int64_t value, int64_t lo, int64_t hi, const char* what) const {
  if (value < lo || value > hi) {
    fail(arg, std::string("expected ") + what + " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] (got " +
                  std::to_string(value) + ")");
  }
}

kl3::Context OpCheck::context(int ncluster) const {
  if (ncluster < 0 || ncluster > kl3::kMaxLaunchClusters) {
    fail("ncluster", "expected 0 (CPU path) or a cluster count in [1, " + std::to_string(kl3::kMaxLaunchClusters) +
                         "] (got " + std::to_string(ncluster) + ")");
  }
  if (dispatch_ >= 0 && args_[dispatch_]->place == PlaceKind::kXPU) {
    // placement() guarantees a binding: the framework's device context and stream of that place.
    const TensorArg& a = *args_[dispatch_];
    kl3::Context ctx = kl3::Context::cpu();
    std::string error;
    if (!a.bind_device(a.handle, ncluster, &ctx, &error)) {
      fail(specs_[dispatch_].name, error, kl3::NOT_IMPLEMENT);
    }
    return ctx;
  }
  if (ncluster == 0) {
    return kl3::Context::cpu();
  }
#ifdef KL3_VENDOR_BUILD
  // A vendor build launches kernels on the chip; host tensors there take the CPU path only.
  fail("ncluster", "the host emulator is not part of a vendor (XTDK) build; host tensors run the CPU path "
                   "(ncluster 0) and Kunlun3 kernels need XPU tensors", kl3::NOT_IMPLEMENT);
#else
  return kl3::Context::emulated_xpu3(ncluster);
#endif
}

void OpCheck::status(int plugin_status) const {
  if (plugin_status != kl3::SUCCESS) {
    std::string message = kl3::last_error();
    if (message.empty()) {
      message = std::string(op_) + ": failed with status " + std::to_string(plugin_status);
    }
    throw OpError(plugin_status, message);
  }
}

}  // namespace fd_ops
