// Native parity driver (OPS §8 C1, C3, C4): every Kunlun3 kernel, run on the host emulator with 1, 2 and 12
// clusters, against the C++ CPU path of the same plugin function, on seeded random in-domain states. Every
// argument tensor sits inside canary guard bands and must come out byte-identical on both backends.
//
// Usage: kl3_native_tests [--cases N] [--seed S]     (exit 0: all identical; 1: a mismatch or failure)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "guarded.h"
#include "kl3/context.h"
#include "xpu/plugin.h"

namespace kl3_native {
namespace {

using fd_xpu::plugin::recover_decode_task;
using fd_xpu::plugin::speculate_clear_accept_nums;
using fd_xpu::plugin::speculate_save_output;
using fd_xpu::plugin::speculate_schedule_cache;
using fd_xpu::plugin::speculate_set_stop_value_multi_seqs;
using fd_xpu::plugin::speculate_set_value_by_flags_and_idx;
using fd_xpu::plugin::speculate_update;

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  int range(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen_); }  // [lo, hi]
  int64_t range64(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen_); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0.0, 1.0)(gen_) < p; }
  // Slot counts: mostly small, sometimes past one cluster's 64 cores or all 768 threads of 12 clusters.
  int slots(int max) {
    const int pick = range(0, 9);
    const int hi = pick < 6 ? 70 : (pick < 9 ? 300 : max);
    return range(1, hi < max ? hi : max);
  }
  std::vector<int32_t> ints(std::size_t n, int lo, int hi) {
    std::vector<int32_t> v(n);
    for (auto& x : v) x = range(lo, hi);
    return v;
  }
  std::vector<int64_t> longs(std::size_t n, int64_t lo, int64_t hi) {
    std::vector<int64_t> v(n);
    for (auto& x : v) x = range64(lo, hi);
    return v;
  }
  std::vector<uint8_t> flags(std::size_t n, double p) {
    std::vector<uint8_t> v(n);
    for (auto& x : v) x = coin(p) ? 1 : 0;
    return v;
  }

 private:
  std::mt19937_64 gen_;
};

const int64_t kTokenMax = INT64_C(1) << 40;  // tokens beyond int32 catch truncation

// One randomized call: its tensors and how to run the plugin function on a guarded copy of them.
struct Case {
  std::string description;
  std::vector<Tensor> tensors;
  std::function<int(kl3::Context*, GuardedSet&)> call;
};

Case update_case(Rng& r) {
  const int B = r.slots(fd_xpu::plugin::kSpeculateUpdateMaxSlots), R = r.range(1, B), T = r.range(1, 9);
  std::vector<int32_t> enc(B), n(B);
  for (int b = 0; b < B; ++b) {
    enc[b] = r.coin(0.25) ? r.range(1, 200) : 0;
    n[b] = r.range(0, T);
  }
  Case c;
  c.description = "speculate_update B=" + std::to_string(B) + " R=" + std::to_string(R) + " T=" + std::to_string(T);
  c.tensors = {Tensor::of("seq_lens_encoder", enc),
               Tensor::of("seq_lens_decoder", r.ints(B, 0, 100000)),
               Tensor::of("not_need_stop", std::vector<uint8_t>{static_cast<uint8_t>(r.range(0, 1))}),
               Tensor::of("draft_tokens", r.longs(static_cast<std::size_t>(B) * T, -kTokenMax, kTokenMax)),
               Tensor::of("actual_draft_token_nums", r.ints(B, 1, T + 2)),
               Tensor::of("accept_tokens", r.longs(static_cast<std::size_t>(B) * T, 0, kTokenMax)),
               Tensor::of("accept_num", n),
               Tensor::of("stop_flags", r.flags(B, 0.3)),
               Tensor::of("seq_lens_this_time", r.ints(R, 0, T)),
               Tensor::of("is_block_step", r.flags(B, 0.15)),
               Tensor::of("mask_rollback", r.ints(B, -5, 5))};
  c.call = [=](kl3::Context* ctx, GuardedSet& g) {
    return speculate_update(ctx, g.ptr<int32_t>(0), g.ptr<int32_t>(1), g.ptr<bool>(2), g.ptr<int64_t>(3),
                            g.ptr<int32_t>(4), g.ptr<int64_t>(5), g.ptr<int32_t>(6), g.ptr<bool>(7),
                            g.ptr<int32_t>(8), g.ptr<bool>(9), g.ptr<int32_t>(10), B, R, T);
  };
  return c;
}

Case set_value_case(Rng& r) {
  const int B = r.slots(1024), R = r.range(1, B), T = r.range(1, 9), M = r.range(1, 48);
  std::vector<int32_t> enc(B), dec(B);
  for (int b = 0; b < B; ++b) {
    enc[b] = r.coin(0.2) ? r.range(1, 50) : 0;
    dec[b] = r.coin(0.2) ? 0 : r.range(1, 500);
  }
  Case c;
  c.description = "speculate_set_value_by_flags_and_idx B=" + std::to_string(B) + " R=" + std::to_string(R) +
                  " T=" + std::to_string(T) + " M=" + std::to_string(M);
  c.tensors = {Tensor::of("pre_ids_all", r.longs(static_cast<std::size_t>(B) * M, -1, kTokenMax)),
               Tensor::of("accept_tokens", r.longs(static_cast<std::size_t>(B) * T, 0, kTokenMax)),
               Tensor::of("accept_num", r.ints(B, 0, T)),
               Tensor::of("stop_flags", r.flags(B, 0.3)),
               Tensor::of("seq_lens_this_time", r.ints(R, 0, T)),
               Tensor::of("seq_lens_encoder", enc),
               Tensor::of("seq_lens_decoder", dec),
               Tensor::of("step_idx", r.longs(B, 0, M - 1))};
  c.call = [=](kl3::Context* ctx, GuardedSet& g) {
    return speculate_set_value_by_flags_and_idx(ctx, g.ptr<int64_t>(0), g.ptr<int64_t>(1), g.ptr<int32_t>(2),
                                                g.ptr<bool>(3), g.ptr<int32_t>(4), g.ptr<int32_t>(5),
                                                g.ptr<int32_t>(6), g.ptr<int64_t>(7), B, R, M, T);
  };
  return c;
}

Case set_stop_case(Rng& r) {
  const int B = r.slots(1024), R = r.range(1, B), T = r.range(1, 9), M = r.range(T + 1, T + 40);
  const int S = r.range(1, 4), SL = r.range(1, 4), E = r.range(1, 3);
  const int alphabet = r.range(2, 4);  // few distinct tokens, so that stop sequences do match
  std::vector<int32_t> n(B);
  std::vector<int64_t> s(B), min_tokens(B);
  for (int b = 0; b < B; ++b) {
    n[b] = r.range(0, T);
    s[b] = r.range(n[b], M - 1);
    min_tokens[b] = r.range64(0, s[b] + 2);
  }
  Case c;
  c.description = "speculate_set_stop_value_multi_seqs B=" + std::to_string(B) + " R=" + std::to_string(R) +
                  " T=" + std::to_string(T) + " M=" + std::to_string(M) + " S=" + std::to_string(S) +
                  " SL=" + std::to_string(SL);
  c.tensors = {Tensor::of("accept_tokens", r.longs(static_cast<std::size_t>(B) * T, 0, alphabet)),
               Tensor::of("accept_num", n),
               Tensor::of("pre_ids", r.longs(static_cast<std::size_t>(B) * M, 0, alphabet)),
               Tensor::of("step_idx", s),
               Tensor::of("stop_flags", r.flags(B, 0.2)),
               Tensor::of("seq_lens", r.ints(R, 0, T)),
               Tensor::of("stop_seqs", r.longs(static_cast<std::size_t>(B) * S * SL, 0, alphabet)),
               Tensor::of("stop_seqs_len", r.ints(static_cast<std::size_t>(B) * S, 0, SL)),
               Tensor::of("end_ids", r.longs(E, kTokenMax / 2, kTokenMax)),
               Tensor::of("min_tokens", min_tokens)};
  c.call = [=](kl3::Context* ctx, GuardedSet& g) {
    return speculate_set_stop_value_multi_seqs(ctx, g.ptr<int64_t>(0), g.ptr<int32_t>(1), g.ptr<int64_t>(2),
                                               g.ptr<int64_t>(3), g.ptr<bool>(4), g.ptr<int32_t>(5),
                                               g.ptr<int64_t>(6), g.ptr<int32_t>(7), g.ptr<int64_t>(8),
                                               g.ptr<int64_t>(9), B, R, T, M, S, SL, E);
  };
  return c;
}

Case schedule_case(Rng& r) {
  const int B = r.slots(1024), R = r.range(1, B), T = r.range(1, 9), NB = r.range(1, 8);
  const int block_size = r.range(1, 16), K = r.range(0, 4);
  const bool one_step = r.coin(0.2);
  std::vector<int32_t> tables(static_cast<std::size_t>(B) * NB);
  for (auto& x : tables) x = r.coin(0.5) ? -1 : r.range(0, 1000);
  Case c;
  c.description = "speculate_schedule_cache B=" + std::to_string(B) + " R=" + std::to_string(R) +
                  " T=" + std::to_string(T) + " NB=" + std::to_string(NB) + " block_size=" +
                  std::to_string(block_size) + " K=" + std::to_string(K) + (one_step ? " one-step" : "");
  c.tensors = {Tensor::of("draft_tokens", r.longs(static_cast<std::size_t>(B) * T, 0, kTokenMax)),
               Tensor::of("block_tables", tables),
               Tensor::of("stop_flags", r.flags(B, 0.3)),
               Tensor::of("prompt_lens", r.longs(B, 0, 120)),
               Tensor::of("seq_lens_this_time", r.ints(R, 0, T)),
               Tensor::of("seq_lens_encoder", r.ints(B, 0, 50)),
               Tensor::of("seq_lens_decoder", r.ints(B, 0, 100)),
               Tensor::of("step_seq_lens_decoder", r.ints(B, 0, 100)),
               Tensor::of("step_draft_tokens", r.longs(static_cast<std::size_t>(B) * T, 0, kTokenMax)),
               Tensor::of("step_seq_lens_this_time", r.ints(B, 0, T)),
               Tensor::of("accept_num", r.ints(B, 0, T)),
               Tensor::of("accept_tokens", r.longs(static_cast<std::size_t>(B) * T, 0, kTokenMax)),
               Tensor::of("is_block_step", r.flags(B, 0.1)),
               Tensor::of("not_need_stop", std::vector<uint8_t>{static_cast<uint8_t>(r.range(0, 1))})};
  c.call = [=](kl3::Context* ctx, GuardedSet& g) {
    return speculate_schedule_cache(ctx, g.ptr<int64_t>(0), g.ptr<int32_t>(1), g.ptr<bool>(2), g.ptr<int64_t>(3),
                                    g.ptr<int32_t>(4), g.ptr<int32_t>(5), g.ptr<int32_t>(6), g.ptr<int32_t>(7),
                                    g.ptr<int64_t>(8), g.ptr<int32_t>(9), g.ptr<int32_t>(10), g.ptr<int64_t>(11),
                                    g.ptr<bool>(12), g.ptr<bool>(13), B, R, T, NB, block_size, K, one_step);
  };
  return c;
}

Case recover_case(Rng& r) {
  const int B = r.slots(1024), R = r.range(1, B), T = r.range(1, 9), NB = r.range(1, 8);
  const int block_size = r.range(1, 16), K = r.range(0, 4);
  const bool spec = r.coin(0.6);
  std::vector<int32_t> tables(static_cast<std::size_t>(B) * NB);
  for (auto& x : tables) x = r.coin(0.4) ? -1 : r.range(0, 1000);
  Case c;
  c.description = std::string(spec ? "recover_decode_task (speculative)" : "recover_decode_task") +
                  " B=" + std::to_string(B) + " R=" + std::to_string(R) + " T=" + std::to_string(T) +
                  " NB=" + std::to_string(NB) + " block_size=" + std::to_string(block_size) +
                  " K=" + std::to_string(K);
  c.tensors = {Tensor::of("stop_flags", r.flags(B, 0.5)),
               Tensor::of("seq_lens_this_time", r.ints(R, 0, T)),
               Tensor::of("seq_lens_encoder", r.ints(B, 0, 50)),
               Tensor::of("seq_lens_decoder", r.ints(B, 0, 100)),
               Tensor::of("step_seq_lens_decoder", r.ints(B, 0, 150)),
               Tensor::of("block_tables", tables),
               Tensor::of("is_block_step", r.flags(B, 0.5))};
  if (spec) {
    c.tensors.push_back(Tensor::of("draft_tokens", r.longs(static_cast<std::size_t>(B) * T, 0, kTokenMax)));
    c.tensors.push_back(Tensor::of("step_draft_tokens", r.longs(static_cast<std::size_t>(B) * T, 0, kTokenMax)));
    c.tensors.push_back(Tensor::of("step_seq_lens_this_time", r.ints(B, 0, T)));
  }
  c.call = [=](kl3::Context* ctx, GuardedSet& g) {
    return recover_decode_task(ctx, g.ptr<bool>(0), g.ptr<int32_t>(1), g.ptr<int32_t>(2), g.ptr<int32_t>(3),
                               g.ptr<int32_t>(4), g.ptr<int32_t>(5), g.ptr<bool>(6),
                               spec ? g.ptr<int64_t>(7) : nullptr, spec ? g.ptr<int64_t>(8) : nullptr,
                               spec ? g.ptr<int32_t>(9) : nullptr, B, R, NB, T, block_size, K);
  };
  return c;
}

Case clear_case(Rng& r) {
  const int B = r.slots(1024);
  std::vector<int32_t> dec(B);
  for (auto& x : dec) x = r.coin(0.5) ? 0 : r.range(1, 100);
  Case c;
  c.description = "speculate_clear_accept_nums B=" + std::to_string(B);
  c.tensors = {Tensor::of("accept_num", r.ints(B, 0, 9)), Tensor::of("seq_lens_decoder", dec)};
  c.call = [=](kl3::Context* ctx, GuardedSet& g) {
    return speculate_clear_accept_nums(ctx, g.ptr<int32_t>(0), g.ptr<int32_t>(1), B);
  };
  return c;
}

// speculate_save_output has no kernel (host assembly on every backend, OPS §5.7): the emulated-context call must
// still equal the CPU path, and both run under the sanitizers here.
Case save_output_case(Rng& r) {
  const int bsz = r.slots(1024), T = r.range(1, 9);
  const int rank_id = r.range(0, 2);
  const bool save_each_rank = r.coin(0.5), skip_prefill = r.coin(0.8);
  const int64_t msg_numel = fd_xpu::plugin::speculate_save_output_msg_numel(bsz, T, rank_id, save_each_rank);
  std::vector<int32_t> counts(bsz);
  for (auto& x : counts) x = r.coin(0.05) ? -3 : r.range(0, T);
  Case c;
  c.description = "speculate_save_output bsz=" + std::to_string(bsz) + " T=" + std::to_string(T) +
                  " rank_id=" + std::to_string(rank_id) + (save_each_rank ? " save_each_rank" : "") +
                  (skip_prefill ? " skip_prefill" : "");
  c.tensors = {Tensor::of("accept_tokens", r.longs(static_cast<std::size_t>(bsz) * T, 0, kTokenMax)),
               Tensor::of("accept_num", counts),
               Tensor::of("not_need_stop", std::vector<uint8_t>{static_cast<uint8_t>(r.range(0, 1))}),
               Tensor::of("seq_lens_decoder", r.ints(bsz, 0, 200)),
               Tensor::of("prompt_lens", r.longs(bsz, 0, 200)),
               Tensor::of("preempted_idx", r.ints(bsz, 0, 1)),
               Tensor::of("msg", std::vector<int64_t>(static_cast<std::size_t>(msg_numel), -7))};
  c.call = [=](kl3::Context* ctx, GuardedSet& g) {
    return speculate_save_output(ctx, g.ptr<int64_t>(0), g.ptr<int32_t>(1), g.ptr<bool>(2), g.ptr<int32_t>(3),
                                 g.ptr<int64_t>(4), g.ptr<int32_t>(5), msg_numel > 0 ? g.ptr<int64_t>(6) : nullptr,
                                 bsz, T, rank_id, save_each_rank, skip_prefill);
  };
  return c;
}

// Runs `c` on the CPU path and on the emulated kernel with each cluster count; reports the first discrepancy.
bool check_case(const Case& c, int index, uint64_t seed) {
  GuardedSet expected(c.tensors);
  kl3::Context cpu = kl3::Context::cpu();
  const int cpu_status = c.call(&cpu, expected);
  const char* failure = nullptr;
  std::string detail;
  int clusters_used = 0;
  if (cpu_status != kl3::SUCCESS) {
    failure = "CPU path failed";
    detail = kl3::last_error();
  } else if (!expected.broken_canary().empty()) {
    failure = "CPU path wrote outside";
    detail = expected.broken_canary();
  }
  for (int ncluster : {1, 2, 12}) {
    if (failure != nullptr) break;
    clusters_used = ncluster;
    GuardedSet actual(c.tensors);
    kl3::Context xpu = kl3::Context::emulated_xpu3(ncluster);
    if (c.call(&xpu, actual) != kl3::SUCCESS) {
      failure = "kernel failed";
      detail = kl3::last_error();
    } else if (!actual.broken_canary().empty()) {
      failure = "kernel wrote outside";
      detail = actual.broken_canary();
    } else if (!actual.first_difference(expected).empty()) {
      failure = "kernel differs from the CPU path at";
      detail = actual.first_difference(expected);
    }
  }
  if (failure == nullptr) return true;
  std::printf("FAIL case %d (seed %llu) %s, ncluster=%d: %s %s\n", index, static_cast<unsigned long long>(seed),
              c.description.c_str(), clusters_used, failure, detail.c_str());
  return false;
}

}  // namespace
}  // namespace kl3_native

int main(int argc, char** argv) {
  using namespace kl3_native;
  int cases = 200;
  uint64_t seed = 20240601;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--cases N] [--seed S]\n", argv[0]);
      return 2;
    }
    if (std::strcmp(argv[i], "--cases") == 0) {
      cases = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--seed") == 0) {
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--cases N] [--seed S]\n", argv[0]);
      return 2;
    }
  }
  struct Op {
    const char* name;
    Case (*make)(Rng&);
  };
  const Op ops[] = {{"speculate_update", update_case},
                    {"speculate_set_value_by_flags_and_idx", set_value_case},
                    {"speculate_set_stop_value_multi_seqs", set_stop_case},
                    {"speculate_schedule_cache", schedule_case},
                    {"recover_decode_task", recover_case},
                    {"speculate_clear_accept_nums", clear_case},
                    {"speculate_save_output", save_output_case}};
  int failures = 0;
  for (std::size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); ++k) {
    const Op& op = ops[k];
    Rng rng(seed * 1000003u + k);
    int ok = 0;
    for (int i = 0; i < cases; ++i) {
      if (check_case(op.make(rng), i, seed)) ++ok;
    }
    failures += cases - ok;
    std::printf("%-40s %d/%d cases identical (CPU path vs kernel at 1, 2, 12 clusters, guard bands intact)\n",
                op.name, ok, cases);
  }
  std::printf("%s\n", failures == 0 ? "PARITY OK" : "PARITY FAILED");
  return failures == 0 ? 0 : 1;
}
