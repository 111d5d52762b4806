// fd_cpu_moe_route (OPS §13.5): an ERNIE MoE layer's router and the grouping of its choices by expert, in one op,
// so that a pass's routed experts (fd_cpu_moe_experts, OPS §13.2) follow without the host's NumPy between them.
//
//   fd_cpu_moe_route(x [M, H] float32, gate [E, H] float32, bias [E] float32, top_k, norm_min)
//     -> tokens [M k] int64, weights [M k] float32, run_ends [R] int64, experts [R] int64
//
// Per row of x: logits[e] = x · gate[e] (16 float32 lanes, one FMA chain each over H, then their sum as
// _mm512_reduce_add_ps pairs them), p = softmax(logits) (expf(l - max), their sum in e order, each divided by it),
// the top_k experts by p + bias (largest first, the lower index first among equals), their weights
// p[chosen] / max(Σ p[chosen] in choice order, norm_min). The (row, choice) pairs then go expert by expert (rows in
// order within an expert): R runs, run r = expert experts[r], pairs run_ends[r - 1] .. run_ends[r] - 1 (from 0).
// A row's choice and weights depend on that row alone.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "paged_cache.h"
#include "paddle/extension.h"

namespace {

constexpr const char* kRouteOp = "fd_cpu_moe_route";

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")

float row_dot(const float* a, const float* b, int64_t h) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < h; c += 16) {
    const __mmask16 m = fd_cpu::lanes(h - c);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + c), _mm512_maskz_loadu_ps(m, b + c), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

#pragma GCC pop_options

}  // namespace

std::vector<paddle::Tensor> MoeRoute(const paddle::Tensor& x, const paddle::Tensor& gate, const paddle::Tensor& bias,
                                     int64_t top_k, float norm_min) {
  const auto f32 = [](const paddle::Tensor& t) { return t.is_cpu() && t.dtype() == paddle::DataType::FLOAT32; };
  fd_cpu::require(fd_cpu::has_dpbf16(), kRouteOp, "this CPU lacks the AVX-512 the kernel is built for");
  fd_cpu::require(f32(x) && x.shape().size() == 2, kRouteOp, "argument 'x' must be a float32 CPU tensor [M, H]");
  const int64_t m = x.shape()[0], h = x.shape()[1];
  fd_cpu::require(f32(gate) && gate.shape().size() == 2 && gate.shape()[1] == h && gate.shape()[0] > 0, kRouteOp,
                  "argument 'gate' must be a float32 CPU tensor [E, " + std::to_string(h) + "]");
  const int64_t e = gate.shape()[0];
  fd_cpu::require(f32(bias) && bias.numel() == e, kRouteOp,
                  "argument 'bias' must be a float32 CPU tensor [" + std::to_string(e) + "]");
  fd_cpu::require(top_k >= 1 && top_k <= e, kRouteOp,
                  "attribute 'top_k' must be in 1 .. " + std::to_string(e) + ", got " + std::to_string(top_k));
  const float* xs = x.data<float>();
  const float* gs = gate.data<float>();
  const float* bs = bias.data<float>();
  std::vector<int64_t> chosen(m * top_k);
  std::vector<float> chosen_w(m * top_k), p(e), score(e);
  std::vector<int64_t> order(e);
  for (int64_t r = 0; r < m; ++r) {
    float top = -INFINITY;
    for (int64_t j = 0; j < e; ++j) top = std::max(top, p[j] = row_dot(xs + r * h, gs + j * h, h));
    float sum = 0.0f;
    for (int64_t j = 0; j < e; ++j) sum += (p[j] = std::exp(p[j] - top));
    for (int64_t j = 0; j < e; ++j) score[j] = (p[j] /= sum) + bs[j];
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    float picked = 0.0f;
    for (int64_t c = 0; c < top_k; ++c) picked += p[order[c]];
    const float denom = std::max(picked, norm_min);
    for (int64_t c = 0; c < top_k; ++c) {
      chosen[r * top_k + c] = order[c];
      chosen_w[r * top_k + c] = p[order[c]] / denom;
    }
  }
  // the pairs expert by expert, rows in order within each (a counting sort)
  std::vector<int64_t> count(e + 1, 0);
  for (int64_t c : chosen) ++count[c + 1];
  std::partial_sum(count.begin(), count.end(), count.begin());
  const int64_t pairs = m * top_k;
  auto tokens = paddle::empty({pairs}, paddle::DataType::INT64, paddle::CPUPlace());
  auto weights = paddle::empty({pairs}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  std::vector<int64_t> next(count.begin(), count.end() - 1);
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t slot = next[chosen[i]]++;
    tokens.data<int64_t>()[slot] = i / top_k;
    weights.data<float>()[slot] = chosen_w[i];
  }
  std::vector<int64_t> ends, experts;
  for (int64_t j = 0; j < e; ++j)
    if (count[j + 1] > count[j]) {
      ends.push_back(count[j + 1]);
      experts.push_back(j);
    }
  const int64_t runs = static_cast<int64_t>(ends.size());
  auto run_ends = paddle::empty({runs}, paddle::DataType::INT64, paddle::CPUPlace());
  auto run_experts = paddle::empty({runs}, paddle::DataType::INT64, paddle::CPUPlace());
  std::copy(ends.begin(), ends.end(), run_ends.data<int64_t>());
  std::copy(experts.begin(), experts.end(), run_experts.data<int64_t>());
  return {tokens, weights, run_ends, run_experts};
}

std::vector<std::vector<int64_t>> MoeRouteShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                                const std::vector<int64_t>&, int64_t top_k, float) {
  return {{x[0] * top_k}, {x[0] * top_k}, {-1}, {-1}};
}
std::vector<paddle::DataType> MoeRouteDtype(const paddle::DataType&, const paddle::DataType&,
                                            const paddle::DataType&) {
  return {paddle::DataType::INT64, paddle::DataType::FLOAT32, paddle::DataType::INT64, paddle::DataType::INT64};
}

PD_BUILD_OP(fd_cpu_moe_route)
    .Inputs({"x", "gate", "bias"})
    .Outputs({"tokens", "weights", "run_ends", "experts"})
    .Attrs({"top_k: int64_t", "norm_min: float"})
    .SetInferShapeFn(PD_INFER_SHAPE(MoeRouteShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MoeRouteDtype))
    .SetKernelFn(PD_KERNEL(MoeRoute));
