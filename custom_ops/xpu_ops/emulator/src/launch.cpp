// Kernel launches on the host emulator (XPU3_KERNEL_MODEL §12.1, E1/E2): a persistent pool of 64 worker threads
// reused by every launch runs the cores of one cluster at a time; clusters run one after another.
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>
#include <sstream>

#include "emu_state.h"

namespace kl3emu {
namespace detail {

namespace {

thread_local CoreState t_core;
thread_local std::vector<GmRegion> t_pending_regions;  // registered by this host thread for its next launch
thread_local std::string t_last_launch_error;

std::mutex g_options_mutex;
Options g_options;

// Work handed to the pool for one cluster.
struct Job {
  KernelThunk thunk = nullptr;
  const void* closure = nullptr;
  LaunchState* launch = nullptr;
  ClusterState* cluster = nullptr;
  int ncore = 0;
  int ncluster = 0;
  bool eager = false;  // worker i runs exactly core i (no worker runs two cores of a cluster)
};

void run_core(const Job& job, int core_index) {
  CoreState& c = t_core;
  c.id = Identity{core_index, job.cluster->cluster_id, job.ncore, job.ncluster};
  c.launch = job.launch;
  c.cluster = job.cluster;
  c.lm_used = 0;
  c.pending.clear();
  try {
    job.thunk(job.closure);
    if (!c.pending.empty() && !job.launch->failed.load()) {
      std::ostringstream msg;
      msg << "kernel returned with " << c.pending.size()
          << " _ASYNC copies still pending (missing mfence before the end of the kernel)";
      record_failure(*job.launch, describe_core() + ": " + msg.str());
      abort_cluster(*job.cluster);
    }
  } catch (const KernelAbort&) {
    // The failure was recorded by whoever threw.
  } catch (const std::exception& e) {
    record_failure(*job.launch, describe_core() + ": exception in kernel: " + e.what());
    abort_cluster(*job.cluster);
  }
  c.pending.clear();
  core_exited(*job.cluster, core_index);
  c.launch = nullptr;
  c.cluster = nullptr;
}

// 64 threads created once and reused by every launch. Cores are handed out lazily: a worker takes the next
// core not yet started and runs it; when that core finishes the worker takes another one, and when it blocks
// at a barrier another worker is woken to take the remaining cores (core_blocking()). Kernels without barriers
// therefore run their cores one after another on one thread, while every core that waits at a barrier has a
// thread of its own, so barriers behave as on the chip. With Options::eager_threads every core gets its own
// thread from the start (used under ThreadSanitizer, which only sees races between concurrent threads).
class Pool {
 public:
  Pool() {
    for (int i = 0; i < kMaxCoresPerCluster; ++i) {
      pthread_attr_t attr;
      pthread_attr_init(&attr);
      pthread_attr_setstacksize(&attr, 2u << 20);
      pthread_t tid;
      args_[i] = {this, i};
      if (pthread_create(&tid, &attr, &Pool::worker_main, &args_[i]) == 0) {
        pthread_detach(tid);
        ++started_;
      }
      pthread_attr_destroy(&attr);
    }
  }

  // False when the system refused some of the 64 threads: launches would wait for cores that never run.
  bool complete() const { return started_ == kMaxCoresPerCluster; }

  void run(const Job& job) {
    job_ = job;
    next_core_.store(0, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const int nworkers = job.eager ? job.ncore : 1;
    spawned_.store(nworkers, std::memory_order_relaxed);
    active_.store(nworkers, std::memory_order_relaxed);
    for (int i = 0; i < nworkers; ++i) wake(i);
    while (done_.load(std::memory_order_acquire) == 0) futex_wait(&done_, 0, -1);
  }

  // Called by a running core that is about to wait at a barrier: make sure the cores not yet started get a
  // thread. The caller's worker stays active, so the launch cannot complete while this runs.
  void core_blocking() {
    if (job_.eager || next_core_.load(std::memory_order_acquire) >= job_.ncore) return;
    const int w = spawned_.fetch_add(1, std::memory_order_acq_rel);
    if (w >= kMaxCoresPerCluster) return;  // cannot happen: an idle spawned worker would take the core
    active_.fetch_add(1, std::memory_order_acq_rel);
    wake(w);
  }

 private:
  struct WorkerArg {
    Pool* pool;
    int index;
  };

  struct alignas(64) Slot {
    std::atomic<uint32_t> go{0};  // futex word: bumped when worker `index` is needed by the current cluster
  };

  void wake(int index) {
    slots_[index].go.fetch_add(1, std::memory_order_release);
    futex_wake_all(&slots_[index].go);
  }

  static void* worker_main(void* p) {
    WorkerArg* arg = static_cast<WorkerArg*>(p);
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* lo = nullptr;
      std::size_t size = 0;
      pthread_attr_getstack(&attr, &lo, &size);
      t_core.stack_lo = static_cast<const unsigned char*>(lo);
      t_core.stack_hi = static_cast<const unsigned char*>(lo) + size;
      pthread_attr_destroy(&attr);
    }
    arg->pool->loop(arg->index);
    return nullptr;
  }

  void loop(int index) {
    std::atomic<uint32_t>& go = slots_[index].go;
    uint32_t seen = 0;
    for (;;) {
      const uint32_t gen = go.load(std::memory_order_acquire);
      if (gen == seen) {
        futex_wait(&go, seen, -1);
        continue;
      }
      seen = gen;
      if (job_.eager) {
        run_core(job_, index);
      } else {
        for (;;) {
          const int c = next_core_.fetch_add(1, std::memory_order_acq_rel);
          if (c >= job_.ncore) break;
          run_core(job_, c);
        }
      }
      if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        done_.store(1, std::memory_order_release);
        futex_wake_all(&done_);
      }
    }
  }

  WorkerArg args_[kMaxCoresPerCluster];
  Slot slots_[kMaxCoresPerCluster];
  int started_ = 0;
  Job job_;
  std::atomic<int> next_core_{0};
  std::atomic<int> spawned_{0};
  std::atomic<int> active_{0};
  std::atomic<uint32_t> done_{0};
};

// Created on first use and never destroyed: its threads live as long as the process. A forked child has none of
// its parent's threads, so it gets a pool of its own (the parent's copy is abandoned).
Pool& pool() {
  static Pool* p = nullptr;
  static pid_t owner = 0;
  if (p == nullptr || owner != getpid()) {
    p = new Pool();
    owner = getpid();
  }
  return *p;
}

std::mutex g_launch_mutex;  // one launch at a time: the pool and the cluster state are shared

}  // namespace

CoreState& core() { return t_core; }

void core_blocking() { pool().core_blocking(); }

std::string describe_core() {
  const CoreState& c = t_core;
  std::ostringstream out;
  out << "kernel '" << (c.launch ? c.launch->kernel_name : "?") << "' cluster " << c.id.cluster_id << " core "
      << c.id.core_id;
  return out.str();
}

void record_failure(LaunchState& launch, const std::string& what) {
  std::lock_guard<std::mutex> lock(launch.error_mutex);
  if (!launch.failed.load()) {
    launch.error = what;
    launch.failed.store(true);
  }
}

void fault(const std::string& what) {
  CoreState& c = t_core;
  record_failure(*c.launch, describe_core() + ": " + what);
  abort_cluster(*c.cluster);
  throw KernelAbort();
}

bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  struct timespec ts;
  struct timespec* tsp = nullptr;
  if (timeout_ms >= 0) {
    ts.tv_sec = timeout_ms / 1000;
    ts.tv_nsec = static_cast<long>(timeout_ms % 1000) * 1000000L;
    tsp = &ts;
  }
  long r = syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, tsp, nullptr, 0);
  return !(r == -1 && errno == ETIMEDOUT);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace detail

using detail::t_core;

Options options() {
  std::lock_guard<std::mutex> lock(detail::g_options_mutex);
  return detail::g_options;
}

void set_options(const Options& opts) {
  std::lock_guard<std::mutex> lock(detail::g_options_mutex);
  detail::g_options = opts;
}

const Identity& identity() { return detail::t_core.id; }

void register_gm(const void* base, std::size_t bytes) {
  detail::t_pending_regions.push_back(detail::GmRegion{static_cast<const unsigned char*>(base), bytes});
}

const char* last_launch_error() { return detail::t_last_launch_error.c_str(); }

int launch_erased(const char* name, int ncluster, int ncore, KernelThunk thunk, const void* closure) {
  std::vector<detail::GmRegion> regions;
  regions.swap(detail::t_pending_regions);
  if (ncluster < 1 || ncluster > kMaxClusters || ncore < 1 || ncore > kMaxCoresPerCluster) {
    std::ostringstream msg;
    msg << "launch of kernel '" << name << "': invalid geometry <<<" << ncluster << ", " << ncore
        << ">>> (clusters 1.." << kMaxClusters << ", cores 1.." << kMaxCoresPerCluster << ")";
    detail::t_last_launch_error = msg.str();
    return kLaunchInvalid;
  }
  std::lock_guard<std::mutex> lock(detail::g_launch_mutex);
  if (!detail::pool().complete()) {
    detail::t_last_launch_error = std::string("launch of kernel '") + name +
                                  "': the emulator could not start its 64 core threads";
    return kLaunchFault;
  }
  detail::LaunchState launch;
  launch.kernel_name = name;
  launch.opts = options();
  launch.regions.swap(regions);
  static detail::ClusterState* cluster = new detail::ClusterState();
  detail::Job job;
  job.thunk = thunk;
  job.closure = closure;
  job.launch = &launch;
  job.cluster = cluster;
  job.ncore = ncore;
  job.ncluster = ncluster;
  job.eager = launch.opts.eager_threads;
  for (int c = 0; c < ncluster && !launch.failed.load(); ++c) {
    detail::reset_cluster(*cluster, c, ncore);
    detail::pool().run(job);
  }
  if (launch.failed.load()) {
    detail::t_last_launch_error = launch.error;
    return kLaunchFault;
  }
  detail::t_last_launch_error.clear();
  return kLaunchSuccess;
}

}  // namespace kl3emu
