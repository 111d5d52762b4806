// Framework-neutral tensor arguments and their metadata checks (OPS §2.2, §2.3), shared by the Paddle ops and
// the pybind11 module so that both report the same first failing precondition with the same message.
//
// Check order (category-major, each category in argument order): dtype; shape form (rank, per-slot vector,
// non-empty); shape relations; placement; contiguity and writability; storage sharing; element count < 2^31.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "kl3/context.h"

namespace fd_ops {

enum class DType { kBool, kInt32, kInt64, kOther };

// Where a tensor must live: on the dispatch device, or on the host whatever the backend (OPS §2.2).
enum class Where { kDevice, kHost };

// Read-only or written in place (in-place arguments must be writable).
enum class Access { kRead, kWrite };

// Shape form of an argument: a per-slot vector [N] / [N, 1]; a one-element host flag; a matrix; a 3-D tensor.
enum class Form { kVector, kFlag, kMatrix, kTensor3 };

// What the op's contract says about one argument.
struct ArgSpec {
  const char* name;
  DType dtype;
  Form form;
  Where where;
  Access access;
  bool optional = false;  // may be absent (None)
};

// Where a tensor's memory is: host memory, a Kunlun XPU device, or any other device (e.g. a GPU).
enum class PlaceKind { kHost, kXPU, kOther };

// Fills `ctx` with the framework's device context of the tensor behind `handle` (its XPU stream and XDNN context)
// for a launch with `ncluster` clusters (0: every cluster the device context offers). Returns false with a reason
// in `error` when the device cannot run the op.
using BindDevice = bool (*)(const void* handle, int ncluster, kl3::Context* ctx, std::string* error);

// One tensor argument as the binding sees it. The framework adapter fills every field; `place_text` renders
// the placement for error messages only (it is not called on the success path). `bind_device` is set only by an
// adapter built with device support (the Paddle ops with PADDLE_WITH_XPU), for tensors on a device.
struct TensorArg {
  bool present = false;  // false: an optional argument passed as None
  DType dtype = DType::kOther;
  const char* dtype_name = "unknown";
  int rank = 0;
  int64_t dims[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  void* data = nullptr;
  int64_t nbytes = 0;
  PlaceKind place = PlaceKind::kHost;
  int device_id = 0;  // device index of an XPU (or other device) tensor
  bool contiguous = true;
  bool writable = true;
  const void* handle = nullptr;
  std::string (*place_text)(const void* handle) = nullptr;
  BindDevice bind_device = nullptr;

  int64_t numel() const;
  std::string shape_text() const;
};

// A failed op call: status (kl3::Status) and the message "<op>: argument '<arg>': <what>".
class OpError : public std::exception {
 public:
  OpError(int status, std::string message);
  int status() const { return status_; }
  const std::string& message() const { return message_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  int status_;
  std::string message_;
};

// Runs the checks of one op call; every failure throws OpError naming the op and the argument.
class OpCheck {
 public:
  OpCheck(const char* op, const ArgSpec* specs, const TensorArg* const* args, int count);

  // Category passes over all arguments, in argument order. dtypes() also rejects an absent required argument.
  void dtypes() const;
  void forms() const;
  void placement() const;
  void layout() const;
  void storage() const;
  void element_counts() const;

  // Shape relations, called by each op in argument order. `i` indexes the op's argument list.
  void numel_is(int i, int64_t expected, const char* what) const;
  void dims_are(int i, int64_t rows, int64_t cols) const;
  void dim_at_least(int i, int axis, int64_t minimum, const char* what) const;
  void at_least(const char* arg, int64_t value, int64_t minimum, const char* what) const;
  void between(const char* arg, int64_t value, int64_t lo, int64_t hi, const char* what) const;

  [[noreturn]] void fail(const char* arg, const std::string& what, int status = kl3::INVALID_PARAM) const;

  const char* op() const { return op_; }
  // kl3 context for `ncluster`. Host tensors: 0 = CPU path, n >= 1 = Kunlun3 kernel with n clusters on the host
  // emulator. XPU tensors (after placement()): the device's Kunlun3 context and stream, launched with n clusters
  // (0 = every cluster the device offers).
  kl3::Context context(int ncluster) const;
  // Turns a plugin status into OpError carrying kl3::last_error().
  void status(int plugin_status) const;

 private:
  const char* op_;
  const ArgSpec* specs_;
  const TensorArg* const* args_;
  int count_;
  mutable int dispatch_ = -1;  // index of the first present device argument, set by placement()
};

// Data pointer of a present argument (null for an absent optional one), typed for the plugin call.
template <typename T>
T* ptr(const TensorArg& arg) {
  return arg.present ? static_cast<T*>(arg.data) : nullptr;
}

}  // namespace fd_ops
