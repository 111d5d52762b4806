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
  // The dispatch device is the place of the first device argument; host arguments must be CPU tensors.
  int first_device = -1;
  for (int i = 0; i < count_; ++i) {
    const TensorArg& a = *args_[i];
    if (!a.present) {
      continue;
    }
    const auto place = [&a]() { return a.place_text ? a.place_text(a.handle) : std::string("unknown"); };
    if (specs_[i].where == Where::kHost) {
      if (!a.on_cpu) {
        fail(specs_[i].name, "expected a host (CPU) tensor (got " + place() + ")");
      }
      continue;
    }
    if (first_device < 0) {
      first_device = i;
    } else if (a.on_cpu != args_[first_device]->on_cpu) {
      fail(specs_[i].name, "expected the same device as '" + std::string(specs_[first_device].name) + "' (got " +
                               place() + ")");
    }
  }
  if (first_device >= 0 && !args_[first_device]->on_cpu) {
    const TensorArg& a = *args_[first_device];
    fail(specs_[first_device].name,
         "tensors on " + (a.place_text ? a.place_text(a.handle) : std::string("this device")) +
             " are not supported by this build (CPU tensors only)",
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
  // After placement() every tensor is a CPU tensor, so a Kunlun3 launch runs on the host emulator.
  return ncluster == 0 ? kl3::Context::cpu() : kl3::Context::emulated_xpu3(ncluster);
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
