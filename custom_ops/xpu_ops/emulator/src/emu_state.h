// Internal state of the Kunlun3 host emulator shared by its runtime files (launch, barrier, memory).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kl3_emu_runtime.h"

namespace kl3emu {
namespace detail {

// Thrown inside a core to leave the kernel after a launch failure was recorded (never escapes the runtime).
struct KernelAbort {};

struct GmRegion {
  const unsigned char* base;
  std::size_t bytes;
};

struct SmObject {
  const void* key;
  const char* name;
  std::size_t offset;
  std::size_t bytes;
};

// One _ASYNC copy issued but not yet delivered (strict mode).
struct PendingCopy {
  Space to;
  unsigned char* dst;
  std::vector<unsigned char> data;
};

// State of one launch, read by every core.
struct LaunchState {
  const char* kernel_name = "";
  Options opts;
  std::vector<GmRegion> regions;
  std::mutex error_mutex;
  std::atomic<bool> failed{false};
  std::string error;  // first failure only
};

// Barrier bookkeeping of the running cluster.
struct BarrierState {
  std::mutex mutex;
  std::atomic<uint32_t> generation{0};  // futex word
  int arrived = 0;
  int exited = 0;
  bool aborted = false;
  const char* site_file = nullptr;  // call site of the first arrival of the current generation
  int site_line = 0;
  std::vector<const char*> wait_file;  // per core: where it waits (nullptr: not waiting)
  std::vector<int> wait_line;
  std::vector<int> count;              // per core: barriers passed so far
  std::vector<bool> returned;          // per core: has left the kernel
};

// The cluster being run. Clusters run one after another, so one object is reused.
struct ClusterState {
  int cluster_id = 0;
  int ncore = 0;
  alignas(64) unsigned char sm[kSmBudgetBytes];
  unsigned char sm_written[kSmBudgetBytes];  // shadow: byte written by a DMA since cluster start
  std::mutex sm_mutex;
  std::vector<SmObject> sm_objects;
  std::size_t sm_used = 0;
  BarrierState barrier;
};

// Per-core (per worker thread) state.
struct CoreState {
  Identity id{0, 0, 0, 0};
  LaunchState* launch = nullptr;
  ClusterState* cluster = nullptr;
  std::size_t lm_used = 0;
  std::vector<PendingCopy> pending;
  const unsigned char* stack_lo = nullptr;  // this worker thread's stack = the core's LM
  const unsigned char* stack_hi = nullptr;
};

CoreState& core();

// Records the launch's first failure (with kernel, cluster and core), aborts the cluster and throws KernelAbort.
[[noreturn]] void fault(const std::string& what);
// Records a failure without throwing (used where the core is already leaving the kernel).
void record_failure(LaunchState& launch, const std::string& what);
// Wakes every barrier waiter of the cluster so that it leaves the kernel.
void abort_cluster(ClusterState& cluster);
// Bookkeeping when a core leaves the kernel (normally or by KernelAbort).
void core_exited(ClusterState& cluster, int core);
// Resets barrier and shared memory at cluster start.
void reset_cluster(ClusterState& cluster, int cluster_id, int ncore);
void reset_barrier(ClusterState& cluster, int ncore);

// Blocks while *word == expected, at most timeout_ms (< 0: no limit). Returns false on timeout.
bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms);
void futex_wake_all(std::atomic<uint32_t>* word);

std::string describe_core();

// A running core is about to wait at a barrier: start the cores that have not started yet.
void core_blocking();

}  // namespace detail
}  // namespace kl3emu
