// Runs one deliberately broken toy kernel (toy_kernels.xpu) on the emulator and reports whether it was flagged.
// Usage: kl3_toy_kernels <toy> [--compat-barrier] [--simple-dma] [--eager]
// Prints "FLAGGED: <diagnostic>" and exits 1, or "CLEAN" and exits 0 (2 on a usage error).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kl3_launch.h"

namespace kl3_toys {
void control(int* out);
void missing_barrier(int* out, int spin);
void exited_cores_barrier(int* out);
void branch_barrier(int* out);
void out_of_bounds_dma(const int* in, int* out, int n);
void async_read_before_fence(const int64_t* in, int64_t* out);
void async_pending_at_exit(int64_t* out);
void shared_read_before_write(int* out);
void shared_over_budget(int* out);
void local_over_budget(int* out);
void slow_core_barrier(int* out, int spin);
void racy_slot_writes(int* out);
}  // namespace kl3_toys

namespace {

int flagged(const std::string& why) {
  std::printf("FLAGGED: %s\n", why.c_str());
  return 1;
}

// A launch failure is a flag; so is a wrong result of a launch that claimed success.
int verdict(int status, bool result_ok, const std::string& wrong_result) {
  if (status != 0) return flagged(kl3dev::launch_error());
  if (!result_ok) return flagged(wrong_result);
  std::printf("CLEAN\n");
  return 0;
}

int run(const std::string& toy) {
  using namespace kl3_toys;
  int out = 0;
  if (toy == "control" || toy == "missing_barrier") {
    KL3_GM_TENSOR(&out, 1);
    const int status = toy == "control" ? KL3_LAUNCH(control, 2, 64, nullptr, &out)
                                        : KL3_LAUNCH(missing_barrier, 2, 64, nullptr, &out, 200000);
    return verdict(status, out == 64, "sum of per-core counters is " + std::to_string(out) + ", expected 64");
  }
  if (toy == "exited_cores_barrier" || toy == "branch_barrier") {
    KL3_GM_TENSOR(&out, 1);
    const int status = toy == "exited_cores_barrier" ? KL3_LAUNCH(exited_cores_barrier, 1, 64, nullptr, &out)
                                                     : KL3_LAUNCH(branch_barrier, 1, 64, nullptr, &out);
    return verdict(status, out == 1, "kernel did not finish its work");
  }
  if (toy == "out_of_bounds_dma") {
    std::vector<int> in(8, 5);
    KL3_GM_TENSOR(in.data(), in.size());
    KL3_GM_TENSOR(&out, 1);
    const int status = KL3_LAUNCH(out_of_bounds_dma, 1, 64, nullptr, in.data(), &out, static_cast<int>(in.size()));
    return verdict(status, true, "");
  }
  if (toy == "async_read_before_fence") {
    int64_t in = 123456789, result = 0;
    KL3_GM_TENSOR(&in, 1);
    KL3_GM_TENSOR(&result, 1);
    const int status = KL3_LAUNCH(async_read_before_fence, 1, 64, nullptr, &in, &result);
    return verdict(status, result == in, "value read before mfence is " + std::to_string(result) + ", not " +
                                             std::to_string(in));
  }
  if (toy == "async_pending_at_exit") {
    int64_t result = 0;
    KL3_GM_TENSOR(&result, 1);
    const int status = KL3_LAUNCH(async_pending_at_exit, 1, 64, nullptr, &result);
    return verdict(status, result == 7, "LM2GM_ASYNC result never arrived");
  }
  if (toy == "shared_read_before_write") {
    std::vector<int> result(16, 0);
    KL3_GM_TENSOR(result.data(), result.size());
    const int status = KL3_LAUNCH(shared_read_before_write, 1, 64, nullptr, result.data());
    return verdict(status, true, "");
  }
  if (toy == "shared_over_budget" || toy == "local_over_budget") {
    KL3_GM_TENSOR(&out, 1);
    const int status = toy == "shared_over_budget" ? KL3_LAUNCH(shared_over_budget, 1, 64, nullptr, &out)
                                                   : KL3_LAUNCH(local_over_budget, 1, 64, nullptr, &out);
    return verdict(status, true, "");
  }
  if (toy == "racy_slot_writes") {
    KL3_GM_TENSOR(&out, 1);
    const int status = KL3_LAUNCH(racy_slot_writes, 1, 64, nullptr, &out);
    return verdict(status, true, "");
  }
  if (toy == "slow_core_barrier") {
    kl3emu::Options opts = kl3emu::options();
    opts.barrier_timeout_ms = 20;
    kl3emu::set_options(opts);
    KL3_GM_TENSOR(&out, 1);
    const int status = KL3_LAUNCH(slow_core_barrier, 1, 64, nullptr, &out, 10000000);
    return verdict(status, true, "");
  }
  std::fprintf(stderr, "unknown toy '%s'\n", toy.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <toy> [--compat-barrier] [--simple-dma] [--eager]\n", argv[0]);
    return 2;
  }
  kl3emu::Options opts = kl3emu::options();
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--compat-barrier") == 0) {
      opts.strict_barrier = false;
    } else if (std::strcmp(argv[i], "--simple-dma") == 0) {
      opts.strict_dma = false;
    } else if (std::strcmp(argv[i], "--eager") == 0) {
      opts.eager_threads = true;
    } else {
      std::fprintf(stderr, "unknown option '%s'\n", argv[i]);
      return 2;
    }
  }
  kl3emu::set_options(opts);
  return run(argv[1]);
}
