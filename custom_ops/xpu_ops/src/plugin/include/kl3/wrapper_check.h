// Check macros of the plugin wrappers, with the semantics of XDNN's wrapper_check.h (XPU3_KERNEL_MODEL §9.2):
// each contains a `return`, so they are usable only in functions returning an `int` status. Unlike XDNN, every
// failing check records "<op>: argument '<arg>': <what>" in the thread-local last error (XPU3_KERNEL_MODEL §9.4 item
// 1).
//
// The op name comes from a constant `kl3_wrapper_op` that each wrapper file defines once at namespace scope:
//   static const char* const kl3_wrapper_op = "speculate_update";
//
// C++11 (wrappers are compiled with -std=c++11 by the vendor toolchain).
#pragma once

#include <string>

#include "kl3/context.h"

namespace kl3 {

// "expected <a> <cmp> <b> (got <a_val> and <b_val>)"; returns INVALID_PARAM.
inline int fail_compare(const char* op, const char* arg, const char* a, const char* cmp, const char* b,
                        long long a_val, long long b_val) {
  return fail(INVALID_PARAM, op, arg,
              std::string("expected ") + a + " " + cmp + " " + b + " (got " + std::to_string(a_val) + " and " +
                  std::to_string(b_val) + ")");
}

// Pointer check of WRAPPER_CHECK_PTR: a region of `len` elements must have a non-negative length and, unless it
// is empty, a non-null base. (Host builds cannot validate more than that.)
inline int check_ptr(const char* op, const char* arg, long long len, const void* ptr, bool null_ok) {
  if (len < 0) {
    return fail(INVALID_PARAM, op, arg, "negative element count " + std::to_string(len));
  }
  if (ptr == nullptr && len > 0 && !null_ok) {
    return fail(INVALID_PARAM, op, arg, "null pointer for " + std::to_string(len) + " elements");
  }
  return SUCCESS;
}

}  // namespace kl3

// Null context -> INVALID_PARAM. Also clears the last error, so a successful call leaves it empty.
#define WRAPPER_CHECK_CTX(ctx)                                                           \
  do {                                                                                   \
    kl3::clear_last_error();                                                             \
    if ((ctx) == nullptr) {                                                              \
      return kl3::fail(kl3::INVALID_PARAM, kl3_wrapper_op, "ctx", "the context is null"); \
    }                                                                                    \
  } while (0)

// `arg` names the tensor argument the relation is about (e.g. "stop_flags" for the slot count B).
#define KL3_WRAPPER_ASSERT_CMP(ctx, arg, a, cmp, b)                                              \
  do {                                                                                           \
    (void)(ctx);                                                                                 \
    if (!((a)cmp(b))) {                                                                          \
      return kl3::fail_compare(kl3_wrapper_op, (arg), #a, #cmp, #b, static_cast<long long>(a),  \
                               static_cast<long long>(b));                                       \
    }                                                                                            \
  } while (0)

// The comparisons the wrappers use (XDNN also has EQ/NE/GT/LT; add them here when a wrapper needs one).
#define WRAPPER_ASSERT_GE(ctx, arg, a, b) KL3_WRAPPER_ASSERT_CMP(ctx, arg, a, >=, b)
#define WRAPPER_ASSERT_LE(ctx, arg, a, b) KL3_WRAPPER_ASSERT_CMP(ctx, arg, a, <=, b)

// `ptr` must be spelled as the spec's argument name: it is the name in the message. The static_assert catches
// a pointer whose element type does not match `T`.
#define KL3_WRAPPER_CHECK_PTR_IMPL(ctx, T, len, ptr, null_ok)                                         \
  do {                                                                                               \
    (void)(ctx);                                                                                     \
    static_assert(sizeof(*(ptr)) == sizeof(T), "WRAPPER_CHECK_PTR: element type of " #ptr);          \
    int kl3_status_ = kl3::check_ptr(kl3_wrapper_op, #ptr, static_cast<long long>(len), (ptr), null_ok); \
    if (kl3_status_ != kl3::SUCCESS) {                                                               \
      return kl3_status_;                                                                            \
    }                                                                                                \
  } while (0)

#define WRAPPER_CHECK_PTR(ctx, T, len, ptr) KL3_WRAPPER_CHECK_PTR_IMPL(ctx, T, len, ptr, false)

// End of the device dispatch: no implementation for this device type.
#define WRAPPER_UNIMPLEMENTED(ctx)                                                       \
  return kl3::fail_op(kl3::NOT_IMPLEMENT, kl3_wrapper_op,                                \
                      "device type " + std::to_string(static_cast<int>((ctx)->type())) + \
                          " is not supported")

// A kernel launch status other than 0 becomes RUNTIME_ERROR; a diagnostic the launcher left in the last error
// (e.g. the emulator's out-of-bounds report) is kept in the message.
#define KERNEL_ASSERT_SUCCESS(ctx, ret)                                                              \
  do {                                                                                               \
    (void)(ctx);                                                                                     \
    int kl3_launch_ = (ret);                                                                         \
    if (kl3_launch_ != 0) {                                                                          \
      std::string kl3_detail_ = kl3::last_error();                                                   \
      return kl3::fail_op(kl3::RUNTIME_ERROR, kl3_wrapper_op,                                        \
                          "Kunlun3 kernel failed with status " + std::to_string(kl3_launch_) +       \
                              (kl3_detail_.empty() ? std::string() : ": " + kl3_detail_));           \
    }                                                                                                \
  } while (0)
