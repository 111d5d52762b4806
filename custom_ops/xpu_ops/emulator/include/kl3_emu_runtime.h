// Runtime interface of the Kunlun3 host emulator (XPU3_KERNEL_MODEL §12): launches, per-core identity, DMA,
// fences, barriers, shared/local memory accounting. Kernel code never calls this header directly; it uses the
// dialect spelled in kl3_emu.h, and host code launches through kl3_launch.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KL3EMU_HAS_TSAN 1
#endif
#endif
#ifndef KL3EMU_HAS_TSAN
#define KL3EMU_HAS_TSAN 0
#endif

namespace kl3emu {

// Budgets of the project (XPU3_KERNEL_MODEL §4.1): conservative because XPU3 sizes are undocumented.
const int kMaxCoresPerCluster = 64;
const int kMaxClusters = 255;
const std::size_t kSmBudgetBytes = 32 * 1024;
const std::size_t kLmBudgetBytes = 4 * 1024;
// Byte written over every shared-memory arena at cluster start and over every _ASYNC destination at issue time.
const unsigned char kPoisonByte = 0xA5;

// Launch status codes (XRE error codes are 700 + n, XPU3_KERNEL_MODEL §1.2).
const int kLaunchSuccess = 0;
const int kLaunchInvalid = 701;  // bad geometry (cluster or core count)
const int kLaunchFault = 702;    // the kernel violated a rule; see last_launch_error()

// Checking modes (XPU3_KERNEL_MODEL §12.1). Strict is the default for project kernels.
struct Options {
  // Strict: a barrier that some core never reaches (it returned) or that cores reach from different call sites
  // fails the launch. Compat: cores that returned count as arrived (the [I] hardware behaviour).
  bool strict_barrier = true;
  // Strict: _ASYNC copies are captured at issue and delivered at the matching fence; destinations hold poison
  // until then; copies pending at kernel exit fail the launch. Simple: copies happen immediately.
  bool strict_dma = true;
  // A core waiting this long at a barrier fails the launch with a report of which cores wait where.
  int barrier_timeout_ms = 20000;
  // Start every core on its own thread at once instead of lazily (see the pool in src/launch.cpp). Lazy
  // dispatch is faster; eager dispatch lets ThreadSanitizer observe cores running concurrently.
#if defined(__SANITIZE_THREAD__) || KL3EMU_HAS_TSAN
  bool eager_threads = true;
#else
  bool eager_threads = false;
#endif
};
Options options();
void set_options(const Options& opts);

// Identity of the calling core; valid only inside a kernel running on the emulator.
struct Identity {
  int core_id;
  int cluster_id;
  int core_num;
  int cluster_num;
};
const Identity& identity();

// Memory spaces, as bits so a fence can name several.
enum Space { kGM = 1, kLM = 2, kSM = 4 };

// DMA `bytes` from `src` (in space `from`) to `dst` (in space `to`). Every range is checked: GM against the
// launch's registered buffers, SM against one shared object, LM against the core's own stack.
void dma(const char* op, Space from, const void* src, Space to, void* dst, int bytes, bool async);
// Completes this core's pending _ASYNC copies whose destination space is in `spaces` (strict mode).
void fence(int spaces);
// Cluster barrier; `file`/`line` identify the call site for the uniformity check and the deadlock report.
void barrier(const char* file, int line);

// Returns the cluster's shared object for the declaration identified by `key`, allocating it (64-byte aligned,
// poisoned) on first use in the current cluster. Fails the launch if the SM budget would be exceeded.
void* sm_object(const void* key, const char* name, std::size_t bytes);

// Counts a local array against the per-core LM budget for its lifetime (KL3_LOCAL).
class LmReservation {
 public:
  LmReservation(std::size_t bytes, const char* name);
  ~LmReservation();
  LmReservation(const LmReservation&) = delete;
  LmReservation& operator=(const LmReservation&) = delete;

 private:
  std::size_t bytes_;
};

// Registers a GM buffer (base, size in bytes) for the next launch issued by this thread.
void register_gm(const void* base, std::size_t bytes);

// Diagnostic of the last failed launch on this thread ("" after a successful one).
const char* last_launch_error();

// Type-erased launch: runs `thunk(closure)` on `ncore` cores of each of `ncluster` clusters, clusters one after
// another. Returns kLaunchSuccess, kLaunchInvalid or kLaunchFault.
typedef void (*KernelThunk)(const void* closure);
int launch_erased(const char* name, int ncluster, int ncore, KernelThunk thunk, const void* closure);

#if __cplusplus >= 201703L
// Host-side launch helpers (C++17); kernel translation units may be compiled as C++11 and never use them.
template <typename... Params>
struct KernelCall {
  void (*kernel)(Params...);
  std::tuple<Params...> args;

  static void run(const void* self) {
    const KernelCall* call = static_cast<const KernelCall*>(self);
    std::apply(call->kernel, call->args);
  }
};

// Launches `kernel` with `args` converted to the kernel's parameter types (the analogue of <<<...>>>).
template <typename... Params, typename... Args>
int launch(const char* name, int ncluster, int ncore, void (*kernel)(Params...), Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "KL3_LAUNCH: argument count differs from the kernel's");
  KernelCall<Params...> call{kernel, std::tuple<Params...>(static_cast<Params>(std::forward<Args>(args))...)};
  return launch_erased(name, ncluster, ncore, &KernelCall<Params...>::run, &call);
}
#endif  // __cplusplus >= 201703L

}  // namespace kl3emu
