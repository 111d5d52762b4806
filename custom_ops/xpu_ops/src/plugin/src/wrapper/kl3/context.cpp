// Thread-local last-error storage of the plugin (XPU3_KERNEL_MODEL §9.4 item 1).
#include "kl3/context.h"

namespace kl3 {

namespace {
// One message per thread: concurrent plugin calls from different threads never see each other's errors.
thread_local std::string g_last_error;
}  // namespace

const std::string& last_error() { return g_last_error; }

void set_last_error(const std::string& message) { g_last_error = message; }

void clear_last_error() { g_last_error.clear(); }

int fail(int status, const char* op, const char* arg, const std::string& what) {
  g_last_error = std::string(op) + ": argument '" + arg + "': " + what;
  return status;
}

int fail_op(int status, const char* op, const std::string& what) {
  g_last_error = std::string(op) + ": " + what;
  return status;
}

}  // namespace kl3
