// Cluster barrier of the host emulator (XPU3_KERNEL_MODEL §3, §12.1 E3): a counting barrier with generations.
// Strict mode reports (never hangs on) a barrier that some core cannot reach because it returned, and a barrier
// reached from different call sites; compat mode counts returned cores as arrived. Every wait has a timeout
// that reports which cores wait where.
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <sstream>

#include "emu_state.h"

namespace kl3emu {
namespace detail {

namespace {

// "core 5" or "cores 0-3, 7".
std::string format_cores(const std::vector<int>& cores) {
  std::ostringstream out;
  out << (cores.size() == 1 ? "core " : "cores ");
  for (std::size_t i = 0; i < cores.size();) {
    std::size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    if (i > 0) out << ", ";
    out << cores[i];
    if (j > i) out << "-" << cores[j];
    i = j + 1;
  }
  return out.str();
}

// Where each core of the cluster is: waiting at a barrier (grouped by call site), returned, or still running.
std::string describe_cluster(const BarrierState& b, int ncore) {
  std::vector<int> running;
  std::vector<int> gone;
  std::vector<std::pair<std::string, std::vector<int> > > sites;
  for (int i = 0; i < ncore; ++i) {
    if (b.wait_file[i] != nullptr) {
      std::ostringstream site;
      site << b.wait_file[i] << ":" << b.wait_line[i] << " (barrier #" << b.count[i] + 1 << " of that core)";
      bool placed = false;
      for (auto& s : sites) {
        if (s.first == site.str()) {
          s.second.push_back(i);
          placed = true;
        }
      }
      if (!placed) sites.push_back(std::make_pair(site.str(), std::vector<int>(1, i)));
    } else if (b.returned[i]) {
      gone.push_back(i);
    } else {
      running.push_back(i);
    }
  }
  std::ostringstream out;
  const char* sep = "";
  for (const auto& s : sites) {
    out << sep << format_cores(s.second) << (s.second.size() == 1 ? " waits at " : " wait at ") << s.first;
    sep = "; ";
  }
  if (!gone.empty()) {
    out << sep << format_cores(gone) << " returned from the kernel";
    sep = "; ";
  }
  if (!running.empty()) {
    out << sep << format_cores(running) << (running.size() == 1 ? " is" : " are") << " still running";
  }
  return out.str();
}

// Called with b.mutex held: wakes everybody waiting so they leave the kernel.
void abort_locked(BarrierState& b) {
  b.aborted = true;
  b.generation.fetch_add(1, std::memory_order_release);
}

void release_locked(BarrierState& b, int ncore) {
  for (int i = 0; i < ncore; ++i) {
    if (b.wait_file[i] != nullptr) {
      b.wait_file[i] = nullptr;
      ++b.count[i];
    }
  }
  b.arrived = 0;
  b.site_file = nullptr;
  b.generation.fetch_add(1, std::memory_order_release);
}

}  // namespace

void abort_cluster(ClusterState& cluster) {
  BarrierState& b = cluster.barrier;
  {
    std::lock_guard<std::mutex> lock(b.mutex);
    abort_locked(b);
  }
  futex_wake_all(&b.generation);
}

void reset_barrier(ClusterState& cluster, int ncore) {
  BarrierState& b = cluster.barrier;
  std::lock_guard<std::mutex> lock(b.mutex);
  b.arrived = 0;
  b.exited = 0;
  b.aborted = false;
  b.site_file = nullptr;
  b.site_line = 0;
  b.wait_file.assign(ncore, nullptr);
  b.wait_line.assign(ncore, 0);
  b.count.assign(ncore, 0);
  b.returned.assign(ncore, false);
}

void core_exited(ClusterState& cluster, int core_index) {
  BarrierState& b = cluster.barrier;
  const CoreState& c = core();
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(b.mutex);
    ++b.exited;
    b.returned[core_index] = true;
    if (!b.aborted && b.arrived > 0 && b.arrived + b.exited == cluster.ncore) {
      if (c.launch->opts.strict_barrier) {
        std::ostringstream msg;
        msg << "kernel '" << c.launch->kernel_name << "' cluster " << cluster.cluster_id
            << ": non-uniform barrier: " << describe_cluster(b, cluster.ncore)
            << " (strict mode: every core must execute every barrier)";
        record_failure(*c.launch, msg.str());
        abort_locked(b);
      } else {
        release_locked(b, cluster.ncore);
      }
      wake = true;
    }
  }
  if (wake) futex_wake_all(&b.generation);
}

}  // namespace detail

void barrier(const char* file, int line) {
  using namespace detail;
  CoreState& c = core();
  if (c.launch == nullptr) throw std::logic_error("kl3emu: sync_all() called outside a kernel");
  ClusterState& cl = *c.cluster;
  BarrierState& b = cl.barrier;
  const Options& opts = c.launch->opts;
  const int me = c.id.core_id;
  uint32_t my_gen = 0;
  {
    std::unique_lock<std::mutex> lock(b.mutex);
    if (b.aborted) throw KernelAbort();
    std::string problem;
    if (b.arrived == 0) {
      b.site_file = file;
      b.site_line = line;
    } else if (opts.strict_barrier && (b.site_line != line || std::strcmp(b.site_file, file) != 0)) {
      std::ostringstream msg;
      msg << "non-uniform barrier: core " << me << " reaches sync_all() at " << file << ":" << line
          << " while " << describe_cluster(b, cl.ncore)
          << " (strict mode: a barrier must not sit in a core-specific branch)";
      problem = msg.str();
    }
    b.wait_file[me] = file;
    b.wait_line[me] = line;
    ++b.arrived;
    const bool strict = opts.strict_barrier;
    if (problem.empty() && strict && b.exited > 0 && b.arrived + b.exited == cl.ncore) {
      problem = "non-uniform barrier: " + describe_cluster(b, cl.ncore) +
                " (strict mode: every core must execute every barrier)";
    }
    if (!problem.empty()) {
      record_failure(*c.launch, describe_core() + ": " + problem);
      abort_locked(b);
      lock.unlock();
      futex_wake_all(&b.generation);
      throw KernelAbort();
    }
    if (b.arrived == cl.ncore || (!strict && b.arrived + b.exited == cl.ncore)) {
      release_locked(b, cl.ncore);
      lock.unlock();
      futex_wake_all(&b.generation);
      return;
    }
    my_gen = b.generation.load(std::memory_order_relaxed);
  }
  core_blocking();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts.barrier_timeout_ms);
  while (b.generation.load(std::memory_order_acquire) == my_gen) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                            std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      std::unique_lock<std::mutex> lock(b.mutex);
      if (b.generation.load(std::memory_order_relaxed) != my_gen) break;
      std::ostringstream msg;
      msg << "barrier wait timed out after " << opts.barrier_timeout_ms
          << " ms (deadlock): " << describe_cluster(b, cl.ncore);
      record_failure(*c.launch, describe_core() + ": " + msg.str());
      abort_locked(b);
      lock.unlock();
      futex_wake_all(&b.generation);
      throw KernelAbort();
    }
    futex_wait(&b.generation, my_gen, static_cast<int>(left.count()) + 1);
  }
  std::lock_guard<std::mutex> lock(b.mutex);
  if (b.aborted) throw KernelAbort();
}

}  // namespace kl3emu
