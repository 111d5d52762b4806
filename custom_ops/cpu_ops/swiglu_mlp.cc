// fd_cpu_swiglu_mlp (OPS §13.1): the second half of a decoder layer, RMSNorm (after the residual add), gate|up,
// SwiGLU and down, as one op (without the norm: an MoE expert's MLP): fd_cpu_rms_norm's and fd_cpu_linear's
// kernels called in turn (their bits), with the SwiGLU between them vectorized. Why one op: in a decode step the
// host's code between two ops (Python, Paddle's dispatch) runs after each product has streamed megabytes of
// weights through the caches; here two of those gaps a layer go (docs/benchmarks.md "One op for a layer's MLP").
#include <immintrin.h>

#include <cstring>
#include <string>
#include <vector>

#include "dpbf16_linear.h"
#include "paged_cache.h"
#include "paddle/extension.h"

// Defined earlier in this extension's unit (rms_norm.cc, cpu_linear.cc).
std::vector<paddle::Tensor> RmsNorm(const paddle::Tensor& x, const paddle::Tensor& weight,
                                    const paddle::Tensor& residual, float eps);
std::vector<paddle::Tensor> CpuLinear(const paddle::Tensor& x, const paddle::Tensor& packed,
                                      const paddle::Tensor& scales, int64_t k, int64_t n, int kind, int kernel);

namespace {

constexpr const char* kMlpOp = "fd_cpu_swiglu_mlp";

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")   // the kernels only: the ops after them keep the unit's target

// out [M, I] = SwiGLU of gu [M, 2I] ([gate | up]): up * gate / (1 + exp(-gate)) in float32, in that order (phi's
// SwiGLUFunctor's), with glibc's 16-lane expf (libmvec, within 4 ulp of expf; Paddle's kernel calls the scalar expf
// one element at a time, ~4 ns each: 0.2 ms a layer at 16 rows).
paddle::Tensor swiglu_rows(const paddle::Tensor& gu, int64_t inter) {
  const int64_t m = gu.shape()[0];
  auto out = paddle::empty({m, inter}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float* g = gu.data<float>();
  float* o = out.data<float>();
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t r = 0; r < m; ++r, g += 2 * inter, o += inter)
    for (int64_t j = 0; j < inter; j += 16) {
      const __mmask16 mask = fd_cpu::lanes(inter - j);
      const __m512 gate = _mm512_maskz_loadu_ps(mask, g + j), up = _mm512_maskz_loadu_ps(mask, g + inter + j);
      const __m512 e = _ZGVeN16v_expf(_mm512_sub_ps(_mm512_setzero_ps(), gate));
      _mm512_mask_storeu_ps(o + j, mask, _mm512_div_ps(_mm512_mul_ps(up, gate), _mm512_add_ps(one, e)));
    }
  return out;
}

#pragma GCC pop_options

}  // namespace

std::vector<paddle::Tensor> SwigluMlp(const paddle::Tensor& x, const paddle::Tensor& residual,
                                      const paddle::Tensor& norm_weight, const paddle::Tensor& gate_up,
                                      const paddle::Tensor& gate_up_scales, const paddle::Tensor& down,
                                      const paddle::Tensor& down_scales, float eps, int64_t hidden,
                                      int64_t intermediate, int gate_up_kind, int gate_up_kernel, int down_kind,
                                      int down_kernel) {
  PD_CHECK(fd_cpu::has_dpbf16(), kMlpOp, ": this CPU lacks the AVX-512 the kernels are built for");
  PD_CHECK(hidden > 0 && intermediate > 0, kMlpOp, ": attributes 'hidden' and 'intermediate' must be positive");
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32 && x.shape().size() == 2 && x.shape()[1] == hidden,
           kMlpOp, ": argument 'x' must be a float32 CPU tensor [M, ", hidden, "]");
  // no norm weight: no norm (an MoE expert's MLP); x goes to the products as it is
  const bool norm = norm_weight.numel() > 0;
  PD_CHECK(norm || residual.numel() == 0, kMlpOp, ": argument 'residual' needs a norm ('norm_weight' is [0])");
  auto normed = norm ? fd_cpu::stage(kMlpOp, "norm", [&] { return RmsNorm(x, norm_weight, residual, eps); })
                     : std::vector<paddle::Tensor>{x, paddle::empty({0}, paddle::DataType::FLOAT32,
                                                                   paddle::CPUPlace())};
  auto gu = fd_cpu::stage(kMlpOp, "gate_up", [&] {
    return CpuLinear(normed[0], gate_up, gate_up_scales, hidden, 2 * intermediate, gate_up_kind, gate_up_kernel);
  });
  auto act = swiglu_rows(gu[0], intermediate);
  auto out = fd_cpu::stage(kMlpOp, "down", [&] {
    return CpuLinear(act, down, down_scales, intermediate, hidden, down_kind, down_kernel);
  });
  return {out[0], normed[1]};
}

std::vector<std::vector<int64_t>> SwigluMlpShape(const std::vector<int64_t>& x, const std::vector<int64_t>& residual,
                                                 const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                 const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                 const std::vector<int64_t>&, float, int64_t hidden, int64_t, int,
                                                 int, int, int) {
  return {{x[0], hidden}, residual};
}
std::vector<paddle::DataType> SwigluMlpDtype(const paddle::DataType&, const paddle::DataType&,
                                             const paddle::DataType&, const paddle::DataType&,
                                             const paddle::DataType&, const paddle::DataType&,
                                             const paddle::DataType&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_cpu_swiglu_mlp)
    .Inputs({"x", "residual", "norm_weight", "gate_up", "gate_up_scales", "down", "down_scales"})
    .Outputs({"out", "residual_out"})
    .Attrs({"eps: float", "hidden: int64_t", "intermediate: int64_t", "gate_up_kind: int", "gate_up_kernel: int",
            "down_kind: int", "down_kernel: int"})
    .SetInferShapeFn(PD_INFER_SHAPE(SwigluMlpShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SwigluMlpDtype))
    .SetKernelFn(PD_KERNEL(SwigluMlp));

// ---- fd_cpu_moe_experts (OPS §13.2): an MoE layer's routed experts, each over its run of (token, choice) pairs,
// then its shared experts over every row ----

namespace {

constexpr const char* kMoeOp = "fd_cpu_moe_experts";

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")

// out[t] = out[t] + w * y over h contiguous values (a row, or every row): the product rounded, then the sum (no fused
// multiply-add), as the host's `out[t] += w * y` does.
void add_weighted(float* out, const float* y, float w, int64_t h) {
  const __m512 wv = _mm512_set1_ps(w);
  for (int64_t c = 0; c < h; c += 16) {
    const __mmask16 m = fd_cpu::lanes(h - c);
    _mm512_mask_storeu_ps(out + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + c),
                                                    _mm512_mul_ps(wv, _mm512_maskz_loadu_ps(m, y + c))));
  }
}

#pragma GCC pop_options

}  // namespace

std::vector<paddle::Tensor> MoeExperts(const paddle::Tensor& x, const paddle::Tensor& tokens,
                                       const paddle::Tensor& weights, const paddle::Tensor& run_ends,
                                       const std::vector<paddle::Tensor>& gate_up,
                                       const std::vector<paddle::Tensor>& gate_up_scales,
                                       const std::vector<paddle::Tensor>& down,
                                       const std::vector<paddle::Tensor>& down_scales,
                                       const paddle::Tensor& shared_gate_up,
                                       const paddle::Tensor& shared_gate_up_scales,
                                       const paddle::Tensor& shared_down, const paddle::Tensor& shared_down_scales,
                                       int64_t hidden, int64_t intermediate, int gate_up_kind, int gate_up_kernel,
                                       int down_kind, int down_kernel, int64_t shared_intermediate,
                                       int shared_gate_up_kind, int shared_gate_up_kernel, int shared_down_kind,
                                       int shared_down_kernel) {
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32 && x.shape().size() == 2 && x.shape()[1] == hidden,
           kMoeOp, ": argument 'x' must be a float32 CPU tensor [M, ", hidden, "]");
  const int64_t m = x.shape()[0], pairs = tokens.numel(), runs = run_ends.numel();
  PD_CHECK(tokens.dtype() == paddle::DataType::INT64 && run_ends.dtype() == paddle::DataType::INT64, kMoeOp,
           ": arguments 'tokens' and 'run_ends' must be int64");
  PD_CHECK(weights.dtype() == paddle::DataType::FLOAT32 && weights.numel() == pairs, kMoeOp,
           ": argument 'weights' must be float32 [", pairs, "] (one a pair)");
  PD_CHECK(static_cast<int64_t>(gate_up.size()) == runs && static_cast<int64_t>(gate_up_scales.size()) == runs &&
               static_cast<int64_t>(down.size()) == runs && static_cast<int64_t>(down_scales.size()) == runs,
           kMoeOp, ": 'gate_up', 'gate_up_scales', 'down', 'down_scales' must hold one tensor a run (", runs, ")");
  PD_CHECK(shared_intermediate >= 0, kMoeOp, ": attribute 'shared_intermediate' must be >= 0 (0: no shared experts)");
  const int64_t* tok = tokens.data<int64_t>();
  const int64_t* ends = run_ends.data<int64_t>();
  for (int64_t p = 0; p < pairs; ++p)
    PD_CHECK(tok[p] >= 0 && tok[p] < m, kMoeOp, ": argument 'tokens' holds ", tok[p], ", not a row of x");
  for (int64_t r = 0; r < runs; ++r)
    PD_CHECK(ends[r] > (r ? ends[r - 1] : 0) && ends[r] <= pairs, kMoeOp,
             ": argument 'run_ends' must rise from above 0 to the pairs' count");
  PD_CHECK(runs == 0 ? pairs == 0 : ends[runs - 1] == pairs, kMoeOp, ": argument 'run_ends' must end at ", pairs);
  const float* w = weights.data<float>();
  const float* xs = x.data<float>();
  auto out = paddle::full({m, hidden}, 0.0f, paddle::DataType::FLOAT32, paddle::CPUPlace());
  float* os = out.data<float>();
  const paddle::Tensor none = paddle::empty({0}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  for (int64_t r = 0, start = 0; r < runs; start = ends[r++]) {
    const int64_t n = ends[r] - start;
    auto rows = paddle::empty({n, hidden}, paddle::DataType::FLOAT32, paddle::CPUPlace());
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(rows.data<float>() + i * hidden, xs + tok[start + i] * hidden, hidden * sizeof(float));
    auto y = fd_cpu::stage(kMoeOp, "run " + std::to_string(r), [&] {
      return SwigluMlp(rows, none, none, gate_up[r], gate_up_scales[r], down[r], down_scales[r], 0.0f, hidden,
                       intermediate, gate_up_kind, gate_up_kernel, down_kind, down_kernel);
    })[0];
    for (int64_t i = 0; i < n; ++i)
      add_weighted(os + tok[start + i] * hidden, y.data<float>() + i * hidden, w[start + i], hidden);
  }
  if (shared_intermediate > 0) {   // the shared experts over every row, added unweighted after the routed sum
    auto y = fd_cpu::stage(kMoeOp, "shared experts", [&] {
      return SwigluMlp(x, none, none, shared_gate_up, shared_gate_up_scales, shared_down, shared_down_scales, 0.0f,
                       hidden, shared_intermediate, shared_gate_up_kind, shared_gate_up_kernel, shared_down_kind,
                       shared_down_kernel);
    })[0];
    add_weighted(os, y.data<float>(), 1.0f, m * hidden);   // 1 * y is y: the host's `out + shared(x)`, exactly
  }
  return {out};
}

std::vector<std::vector<int64_t>> MoeExpertsShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                                  const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                  const std::vector<std::vector<int64_t>>&,
                                                  const std::vector<std::vector<int64_t>>&,
                                                  const std::vector<std::vector<int64_t>>&,
                                                  const std::vector<std::vector<int64_t>>&,
                                                  const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                  const std::vector<int64_t>&, const std::vector<int64_t>&, int64_t,
                                                  int64_t, int, int, int, int, int64_t, int, int, int, int) {
  return {x};
}
std::vector<paddle::DataType> MoeExpertsDtype(const paddle::DataType&, const paddle::DataType&,
                                              const paddle::DataType&, const paddle::DataType&,
                                              const std::vector<paddle::DataType>&,
                                              const std::vector<paddle::DataType>&,
                                              const std::vector<paddle::DataType>&,
                                              const std::vector<paddle::DataType>&, const paddle::DataType&,
                                              const paddle::DataType&, const paddle::DataType&,
                                              const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_cpu_moe_experts)
    .Inputs({"x", "tokens", "weights", "run_ends", paddle::Vec("gate_up"), paddle::Vec("gate_up_scales"),
             paddle::Vec("down"), paddle::Vec("down_scales"), "shared_gate_up", "shared_gate_up_scales",
             "shared_down", "shared_down_scales"})
    .Outputs({"out"})
    .Attrs({"hidden: int64_t", "intermediate: int64_t", "gate_up_kind: int", "gate_up_kernel: int",
            "down_kind: int", "down_kernel: int", "shared_intermediate: int64_t", "shared_gate_up_kind: int",
            "shared_gate_up_kernel: int", "shared_down_kind: int", "shared_down_kernel: int"})
    .SetInferShapeFn(PD_INFER_SHAPE(MoeExpertsShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MoeExpertsDtype))
    .SetKernelFn(PD_KERNEL(MoeExperts));
