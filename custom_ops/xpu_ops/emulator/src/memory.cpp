// Memory spaces of the host emulator (XPU3_KERNEL_MODEL §4, §5, §6, §12.1 E4-E6): GM registry bounds checks,
// the per-cluster shared-memory arena (poison, budget, read-before-write shadow), LM budget, DMA and fences.
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "emu_state.h"

#if defined(__SANITIZE_ADDRESS__)
#define KL3EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KL3EMU_ASAN 1
#endif
#endif

namespace kl3emu {
namespace detail {

namespace {

const std::size_t kSmAlign = 64;  // __shared__ objects are 64-byte aligned [D GUIDE]

CoreState& kernel_core(const char* what) {
  CoreState& c = core();
  if (c.launch == nullptr) throw std::logic_error(std::string("kl3emu: ") + what + " called outside a kernel");
  return c;
}

std::string hex(const void* p) {
  std::ostringstream out;
  out << p;
  return out.str();
}

bool inside(const unsigned char* p, std::size_t n, const unsigned char* lo, const unsigned char* hi) {
  return p >= lo && p <= hi && n <= static_cast<std::size_t>(hi - p);
}

// Checks that [p, p+n) lies inside one GM buffer registered for the launch.
void check_gm(const char* op, const char* role, const unsigned char* p, std::size_t n) {
  const LaunchState& launch = *core().launch;
  const GmRegion* nearest = nullptr;
  for (const GmRegion& r : launch.regions) {
    if (inside(p, n, r.base, r.base + r.bytes)) return;
    if (p >= r.base && (nearest == nullptr || r.base > nearest->base)) nearest = &r;
  }
  std::ostringstream msg;
  msg << op << ": " << role << " GM range [" << hex(p) << ", +" << n
      << " bytes) is outside every GM buffer registered for this launch";
  if (nearest != nullptr) {
    msg << " (nearest buffer below it: [" << hex(nearest->base) << ", +" << nearest->bytes
        << " bytes), access starts at byte offset " << (p - nearest->base) << ")";
  }
  fault(msg.str());
}

// Checks that [p, p+n) lies inside one shared object of the running cluster; returns it.
const SmObject& check_sm(const char* op, const char* role, const unsigned char* p, std::size_t n) {
  ClusterState& cl = *core().cluster;
  std::lock_guard<std::mutex> lock(cl.sm_mutex);
  for (const SmObject& o : cl.sm_objects) {
    const unsigned char* base = cl.sm + o.offset;
    if (inside(p, n, base, base + o.bytes)) return o;
  }
  std::ostringstream msg;
  msg << op << ": " << role << " SM range [" << hex(p) << ", +" << n
      << " bytes) is not inside one KL3_SHARED object of this cluster";
  fault(msg.str());
}

// LM is the core's own stack (its locals and KL3_LOCAL arrays). Under AddressSanitizer locals may live on a
// fake stack, so there only "not GM, not SM" is checked.
void check_lm(const char* op, const char* role, const unsigned char* p, std::size_t n) {
  const CoreState& c = core();
  const ClusterState& cl = *c.cluster;
  bool ok = !inside(p, 1, cl.sm, cl.sm + kSmBudgetBytes);
  for (const GmRegion& r : c.launch->regions) {
    if (inside(p, 1, r.base, r.base + r.bytes)) ok = false;
  }
#ifndef KL3EMU_ASAN
  if (c.stack_lo != nullptr && !inside(p, n, c.stack_lo, c.stack_hi)) ok = false;
#endif
  if (!ok) {
    std::ostringstream msg;
    msg << op << ": " << role << " LM range [" << hex(p) << ", +" << n
        << " bytes) is not in this core's local memory";
    fault(msg.str());
  }
}

void check_range(const char* op, const char* role, Space s, const void* p, std::size_t n) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  if (s == kGM) {
    check_gm(op, role, b, n);
  } else if (s == kSM) {
    check_sm(op, role, b, n);
  } else {
    check_lm(op, role, b, n);
  }
}

// Shared-memory read-before-write detection: a source run of bytes that no DMA wrote since cluster start and
// that still hold poison means uninitialised shared memory is being read (at least 4 such bytes, or the whole
// copy if shorter, so that a value stored directly by a core is not mistaken for poison).
void check_sm_initialised(const char* op, const unsigned char* src, std::size_t n) {
  ClusterState& cl = *core().cluster;
  const std::size_t off = static_cast<std::size_t>(src - cl.sm);
  const std::size_t need = n < 4 ? n : 4;
  std::size_t run = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool poison = cl.sm_written[off + i] == 0 && src[i] == kPoisonByte;
    run = poison ? run + 1 : 0;
    if (run >= need) {
      const SmObject& o = check_sm(op, "source", src, n);
      std::ostringstream msg;
      msg << op << ": reads bytes of shared object '" << o.name << "' near offset " << (off + i + 1 - run - o.offset)
          << " that were never written since the cluster started (shared memory is uninitialised at kernel "
             "start; write it before reading)";
      fault(msg.str());
    }
  }
}

void deliver(unsigned char* dst, Space to, const unsigned char* data, std::size_t n) {
  std::memcpy(dst, data, n);
  if (to == kSM) {
    ClusterState& cl = *core().cluster;
    std::memset(cl.sm_written + (dst - cl.sm), 1, n);
  }
}

}  // namespace

void reset_cluster(ClusterState& cluster, int cluster_id, int ncore) {
  cluster.cluster_id = cluster_id;
  cluster.ncore = ncore;
  std::memset(cluster.sm, kPoisonByte, kSmBudgetBytes);
  std::memset(cluster.sm_written, 0, kSmBudgetBytes);
  cluster.sm_objects.clear();
  cluster.sm_used = 0;
  reset_barrier(cluster, ncore);
}

}  // namespace detail

void dma(const char* op, Space from, const void* src, Space to, void* dst, int bytes, bool async) {
  using namespace detail;
  CoreState& c = kernel_core(op);
  if (bytes <= 0) {
    std::ostringstream msg;
    msg << op << ": size " << bytes << " bytes (must be positive)";
    fault(msg.str());
  }
  const std::size_t n = static_cast<std::size_t>(bytes);
  check_range(op, "source", from, src, n);
  check_range(op, "destination", to, dst, n);
  const unsigned char* s = static_cast<const unsigned char*>(src);
  unsigned char* d = static_cast<unsigned char*>(dst);
  if (from == kSM) check_sm_initialised(op, s, n);
  if (async && c.launch->opts.strict_dma) {
    // Captured now, visible at the fence; until then the destination holds poison so that reading it early
    // gives a wrong result instead of a lucky stale one.
    PendingCopy copy;
    copy.to = to;
    copy.dst = d;
    copy.data.assign(s, s + n);
    std::memset(d, kPoisonByte, n);
    c.pending.push_back(std::move(copy));
    return;
  }
  deliver(d, to, s, n);
}

void fence(int spaces) {
  using namespace detail;
  CoreState& c = kernel_core("mfence");
  // Simple mode copies at issue, so nothing is pending. Ordering between cores comes from the barrier (whose
  // mutex orders memory); a fence adds none, which keeps ThreadSanitizer's view of the kernel honest.
  if (!c.launch->opts.strict_dma) return;
  std::vector<PendingCopy> keep;
  for (PendingCopy& p : c.pending) {
    if (p.to & spaces) {
      deliver(p.dst, p.to, p.data.data(), p.data.size());
    } else {
      keep.push_back(std::move(p));
    }
  }
  c.pending.swap(keep);
}

void* sm_object(const void* key, const char* name, std::size_t bytes) {
  using namespace detail;
  CoreState& c = kernel_core("KL3_SHARED");
  ClusterState& cl = *c.cluster;
  std::unique_lock<std::mutex> lock(cl.sm_mutex);
  for (const SmObject& o : cl.sm_objects) {
    if (o.key == key) return cl.sm + o.offset;
  }
  const std::size_t offset = (cl.sm_used + kSmAlign - 1) / kSmAlign * kSmAlign;
  if (offset + bytes > kSmBudgetBytes) {
    lock.unlock();
    std::ostringstream msg;
    msg << "KL3_SHARED '" << name << "' (" << bytes << " bytes) exceeds the shared-memory budget of "
        << kSmBudgetBytes << " bytes per cluster (" << offset << " bytes already in use)";
    fault(msg.str());
  }
  cl.sm_objects.push_back(SmObject{key, name, offset, bytes});
  cl.sm_used = offset + bytes;
  return cl.sm + offset;
}

LmReservation::LmReservation(std::size_t bytes, const char* name) : bytes_(bytes) {
  detail::CoreState& c = detail::kernel_core("KL3_LOCAL");
  if (c.lm_used + bytes > kLmBudgetBytes) {
    std::ostringstream msg;
    msg << "KL3_LOCAL '" << name << "' (" << bytes << " bytes) exceeds the local-memory budget of "
        << kLmBudgetBytes << " bytes per core (" << c.lm_used << " bytes already in use)";
    detail::fault(msg.str());
  }
  c.lm_used += bytes;
}

LmReservation::~LmReservation() { detail::core().lm_used -= bytes_; }

}  // namespace kl3emu
