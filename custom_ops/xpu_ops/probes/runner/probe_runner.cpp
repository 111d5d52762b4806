// Host runner of the hardware probes H1-H5 (XPU3_KERNEL_MODEL §14); see kl3_probes.h.
#include "kl3_probes.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#ifdef KL3_VENDOR_BUILD
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#endif

#include "kl3_launch.h"

namespace fd_xpu {
namespace probe {
KL3_KERNEL_DECL void h1_async_fence(const kl3dev::int64* src, kl3dev::int64* out, kl3dev::int64 marker);
KL3_KERNEL_DECL void h2_fill(int* out_unused);
KL3_KERNEL_DECL void h2_read(int* out);
KL3_KERNEL_DECL void h4_shared_32k(int* out);
KL3_KERNEL_DECL void h4_shared_64k(int* out);
KL3_KERNEL_DECL void h4_shared_128k(int* out);
KL3_KERNEL_DECL void h4_local_2k(int* out);
KL3_KERNEL_DECL void h4_local_4k(int* out);
KL3_KERNEL_DECL void h4_local_6k(int* out);
KL3_KERNEL_DECL void h5_exit_barrier(int* out);

namespace {

const int kCores = 64;
const int kH2Words = 1024;  // h2_shared_init.xpu
const int64_t kH1Value = 0x1122334455667788LL;
const int64_t kH1Marker = 0x7E7E7E7E7E7E7E7ELL;
const int64_t kPoison64 = static_cast<int64_t>(0xA5A5A5A5A5A5A5A5ULL);  // emulator poison (kl3_emu_runtime.h)
const int kPoison32 = static_cast<int>(0xA5A5A5A5U);

// A device buffer of `count` elements of T, freed on scope exit.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int count) : count_(count), ptr_(nullptr) {
    ok_ = kl3dev::alloc(reinterpret_cast<void**>(&ptr_), sizeof(T) * count) == 0;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) kl3dev::release(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  bool ok() const { return ok_; }
  T* get() { return ptr_; }
  bool read(std::vector<T>* host, void* stream) {
    host->assign(count_, T());
    return kl3dev::copy_to_host(host->data(), ptr_, sizeof(T) * count_, stream) == 0;
  }
  bool write(const std::vector<T>& host) {
    return kl3dev::copy_to_device(ptr_, host.data(), sizeof(T) * count_) == 0;
  }

 private:
  int count_;
  T* ptr_;
  bool ok_;
};

std::string hex64(int64_t v) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%016llx", static_cast<unsigned long long>(v));
  return text;
}

std::string launch_failure(int ret) {
  return "launch failed with status " + std::to_string(ret) + ": " + kl3dev::launch_error();
}

ProbeResult make(const char* id, const char* question, const char* assumes) {
  ProbeResult r;
  r.id = id;
  r.question = question;
  r.emulator_assumes = assumes;
  r.status = "observed";
  r.matches_emulator = false;
  return r;
}

ProbeResult error(ProbeResult r, const std::string& why) {
  r.status = "error";
  r.observation = why;
  return r;
}

ProbeResult probe_h1(kl3::Context* ctx) {
  ProbeResult r = make("H1", "GM2LM_ASYNC destination read before vs after mfence()",
                       "destination undefined until a fence covering LM (strict mode: poison 0xA5 until mfence)");
  DeviceBuffer<int64_t> src(1), out(2);
  if (!src.ok() || !out.ok() || !src.write(std::vector<int64_t>(1, kH1Value))) {
    return error(r, "cannot allocate or fill device buffers");
  }
  KL3_GM_TENSOR(src.get(), 1);
  KL3_GM_TENSOR(out.get(), 2);
  int ret = KL3_LAUNCH(h1_async_fence, 1, kCores, ctx->stream, kl3dev::i64(src.get()), kl3dev::i64(out.get()),
                       static_cast<kl3dev::int64>(kH1Marker));
  std::vector<int64_t> host;
  if (ret != 0) return error(r, launch_failure(ret));
  if (!out.read(&host, ctx->stream)) return error(r, "device-to-host copy failed");
  const int64_t early = host[0];
  const std::string kind = early == kH1Marker  ? "the marker (stale)"
                           : early == kH1Value ? "the value (already delivered)"
                           : early == kPoison64 ? "poison"
                                                : "other " + hex64(early);
  r.observation = "read before the fence saw " + kind + "; after the fence " +
                  (host[1] == kH1Value ? std::string("the value") : "WRONG " + hex64(host[1]));
  r.matches_emulator = early == kPoison64 && host[1] == kH1Value;
  return r;
}

ProbeResult probe_h2(kl3::Context* ctx) {
  ProbeResult r = make("H2", "__shared__ contents at kernel start (after a launch that filled them)",
                       "undefined: the arena is poisoned (0xA5) at every cluster start; nothing survives a launch");
  DeviceBuffer<int> out(kH2Words);
  if (!out.ok()) return error(r, "cannot allocate device buffers");
  KL3_GM_TENSOR(out.get(), kH2Words);
  int ret = KL3_LAUNCH(h2_fill, 1, kCores, ctx->stream, out.get());
  if (ret != 0) return error(r, "h2_fill: " + launch_failure(ret));
  KL3_GM_TENSOR(out.get(), kH2Words);
  ret = KL3_LAUNCH(h2_read, 1, kCores, ctx->stream, out.get());
  if (ret != 0) return error(r, "h2_read: " + launch_failure(ret));
  std::vector<int> host;
  if (!out.read(&host, ctx->stream)) return error(r, "device-to-host copy failed");
  int pattern = 0, zero = 0, poison = 0;
  for (int i = 0; i < kH2Words; ++i) {
    pattern += host[i] == 0x5A000000 + i;
    zero += host[i] == 0;
    poison += host[i] == kPoison32;
  }
  const int other = kH2Words - pattern - zero - poison;
  r.observation = "of " + std::to_string(kH2Words) + " words: " + std::to_string(pattern) + " previous pattern, " +
                  std::to_string(zero) + " zero, " + std::to_string(poison) + " poison, " + std::to_string(other) +
                  " other";
  r.matches_emulator = poison == kH2Words;
  return r;
}

// H4's kernels, in table order (kernels are launched by name: `<<<...>>>` takes no function pointer).
enum CapacityKernel { kShared32k, kShared64k, kShared128k, kLocal2k, kLocal4k, kLocal6k };

int launch_capacity(kl3::Context* ctx, CapacityKernel which, int* out) {
  switch (which) {
    case kShared32k:
      return KL3_LAUNCH(h4_shared_32k, 1, kCores, ctx->stream, out);
    case kShared64k:
      return KL3_LAUNCH(h4_shared_64k, 1, kCores, ctx->stream, out);
    case kShared128k:
      return KL3_LAUNCH(h4_shared_128k, 1, kCores, ctx->stream, out);
    case kLocal2k:
      return KL3_LAUNCH(h4_local_2k, 1, kCores, ctx->stream, out);
    case kLocal4k:
      return KL3_LAUNCH(h4_local_4k, 1, kCores, ctx->stream, out);
    case kLocal6k:
      return KL3_LAUNCH(h4_local_6k, 1, kCores, ctx->stream, out);
  }
  return -1;
}

// "runs" when the launch succeeds and no core read a word back wrong.
std::string capacity_run(kl3::Context* ctx, CapacityKernel which, bool* runs) {
  *runs = false;
  DeviceBuffer<int> out(kCores);
  if (!out.ok()) return "cannot allocate";
  KL3_GM_TENSOR(out.get(), kCores);
  const int ret = launch_capacity(ctx, which, out.get());
  if (ret != 0) return "fails (launch status " + std::to_string(ret) + ")";
  std::vector<int> host;
  if (!out.read(&host, ctx->stream)) return "fails (device-to-host copy)";
  long long mismatches = 0;
  for (size_t i = 0; i < host.size(); ++i) mismatches += host[i];
  if (mismatches != 0) return "fails (" + std::to_string(mismatches) + " words read back wrong)";
  *runs = true;
  return "runs";
}

ProbeResult probe_h4(kl3::Context* ctx) {
  ProbeResult r = make("H4", "largest __shared__ / local array that compiles and runs",
                       "project budgets: 32 KiB shared per cluster, 4 KiB local per core (launches over them fail)");
  struct Case {
    const char* label;
    CapacityKernel kernel;
    bool shared;
    int kib;
  };
  const Case cases[] = {
      {"shared 32 KiB", kShared32k, true, 32}, {"shared 64 KiB", kShared64k, true, 64},
      {"shared 128 KiB", kShared128k, true, 128}, {"local 2 KiB", kLocal2k, false, 2},
      {"local 4 KiB", kLocal4k, false, 4},     {"local 6 KiB", kLocal6k, false, 6},
  };
  int largest_shared = 0, largest_local = 0;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
    const Case& c = cases[i];
    bool runs = false;
    const std::string outcome = capacity_run(ctx, c.kernel, &runs);
    r.observation += (r.observation.empty() ? "" : "; ") + std::string(c.label) + " " + outcome;
    if (runs && c.shared && c.kib > largest_shared) largest_shared = c.kib;
    if (runs && !c.shared && c.kib > largest_local) largest_local = c.kib;
  }
  r.observation += "; largest that ran: shared " + std::to_string(largest_shared) + " KiB, local " +
                   std::to_string(largest_local) + " KiB";
  r.matches_emulator = largest_shared == 32 && largest_local == 4;
  return r;
}

ProbeResult probe_h5(kl3::Context* ctx) {
  ProbeResult r = make("H5", "cores 1..63 return, core 0 calls sync_all(): does core 0 pass the barrier?",
                       "strict mode fails the launch (a barrier some cores never reach); compat mode counts returned "
                       "cores as arrived. The project never relies on either");
  DeviceBuffer<int> out(1);
  if (!out.ok() || !out.write(std::vector<int>(1, 0))) return error(r, "cannot allocate device buffers");
#ifdef KL3_VENDOR_BUILD
  // A hang is a possible answer: wait at most 5 s, then leave the stuck wait behind (the self-check runs H5 last,
  // in a child process it can end).
  XPUStream stream = static_cast<XPUStream>(ctx->stream);
  if (KL3_LAUNCH(h5_exit_barrier, 1, kCores, ctx->stream, out.get()) != 0) {
    return error(r, launch_failure(-1));
  }
  std::shared_ptr<std::promise<int>> done = std::make_shared<std::promise<int>>();
  std::future<int> finished = done->get_future();
  std::thread([done, stream]() { done->set_value(xpu_wait(stream)); }).detach();
  if (finished.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    r.observation = "core 0 did not pass the barrier within 5 s (hang): returned cores do not count as arrived";
    return r;
  }
  std::vector<int> host;
  if (finished.get() != 0 || !out.read(&host, ctx->stream)) return error(r, "the launch or the copy failed");
  r.observation = host[0] == 1 ? "core 0 passed the barrier: returned cores count as arrived"
                               : "the kernel finished without core 0 writing its flag";
#else
  KL3_GM_TENSOR(out.get(), 1);
  const int strict = KL3_LAUNCH(h5_exit_barrier, 1, kCores, ctx->stream, out.get());
  const ::kl3emu::Options saved = ::kl3emu::options();
  ::kl3emu::Options compat = saved;
  compat.strict_barrier = false;
  ::kl3emu::set_options(compat);
  KL3_GM_TENSOR(out.get(), 1);
  const int relaxed = KL3_LAUNCH(h5_exit_barrier, 1, kCores, ctx->stream, out.get());
  ::kl3emu::set_options(saved);
  std::vector<int> host;
  if (!out.read(&host, ctx->stream)) return error(r, "device-to-host copy failed");
  r.observation = std::string("strict mode: ") + (strict != 0 ? "launch failed" : "launch passed") +
                  "; compat mode: " + (relaxed == 0 && host[0] == 1 ? "core 0 passed the barrier" : "failed");
  r.matches_emulator = strict != 0 && relaxed == 0 && host[0] == 1;
#endif
  return r;
}

ProbeResult probe_h3() {
  ProbeResult r = make("H3", "vsrlp_int32x16 shift counts 32/64/16, vextract_int32x16 masks 1/2/4",
                       "SIMD is not emulated (no kernel of the project uses it)");
  r.status = "not applicable";
  r.observation = "not built: the kernel set uses no SIMD (XPU3_KERNEL_MODEL §14: only if SIMD is adopted)";
  r.matches_emulator = true;
  return r;
}

}  // namespace

std::vector<ProbeResult> run_probes(kl3::Context* ctx, const std::vector<std::string>& ids) {
  static const char* const kOrder[] = {"H1", "H2", "H3", "H4", "H5"};  // H5 (may hang on hardware) last
  std::vector<ProbeResult> results;
  for (size_t k = 0; k < sizeof(kOrder) / sizeof(kOrder[0]); ++k) {
    const std::string name(kOrder[k]);
    bool wanted = ids.empty();
    for (size_t i = 0; i < ids.size(); ++i) wanted = wanted || ids[i] == name;
    if (!wanted) continue;
    if (name == "H1") results.push_back(probe_h1(ctx));
    if (name == "H2") results.push_back(probe_h2(ctx));
    if (name == "H3") results.push_back(probe_h3());
    if (name == "H4") results.push_back(probe_h4(ctx));
    if (name == "H5") results.push_back(probe_h5(ctx));
  }
  return results;
}

}  // namespace probe
}  // namespace fd_xpu
