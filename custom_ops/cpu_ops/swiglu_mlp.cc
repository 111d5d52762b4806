// fd_cpu_swiglu_mlp (OPS §13.1): the second half of a decoder layer, RMSNorm (after the residual add), gate|up,
// SwiGLU and down, as one op: fd_cpu_rms_norm's and fd_cpu_linear's kernels called in turn (their bits), with the
// SwiGLU between them vectorized. Why one op: in a decode step the host's code between two ops (Python, Paddle's
// dispatch) runs after each product has streamed megabytes of weights through the caches; here two of those gaps
// a layer go (docs/benchmarks.md "One op for a layer's MLP").
#include <immintrin.h>

#include <exception>
#include <string>
#include <vector>

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
#pragma GCC target("avx512f,avx512bw,avx512vl")   // the kernel only: the op functions above keep the unit's target

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

// A stage's error under this op's name (the inner op names its own argument).
template <typename Fn>
std::vector<paddle::Tensor> stage(const char* name, Fn fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    PD_THROW(kMlpOp, " (", name, "): ", e.what());
  }
}

}  // namespace

std::vector<paddle::Tensor> SwigluMlp(const paddle::Tensor& x, const paddle::Tensor& residual,
                                      const paddle::Tensor& norm_weight, const paddle::Tensor& gate_up,
                                      const paddle::Tensor& gate_up_scales, const paddle::Tensor& down,
                                      const paddle::Tensor& down_scales, float eps, int64_t hidden,
                                      int64_t intermediate, int gate_up_kind, int gate_up_kernel, int down_kind,
                                      int down_kernel) {
  PD_CHECK(hidden > 0 && intermediate > 0, kMlpOp, ": attributes 'hidden' and 'intermediate' must be positive");
  PD_CHECK(x.shape().size() == 2 && x.shape()[1] == hidden, kMlpOp, ": argument 'x' must be [M, ", hidden, "]");
  auto normed = stage("norm", [&] { return RmsNorm(x, norm_weight, residual, eps); });
  auto gu = stage("gate_up", [&] {
    return CpuLinear(normed[0], gate_up, gate_up_scales, hidden, 2 * intermediate, gate_up_kind, gate_up_kernel);
  });
  auto act = swiglu_rows(gu[0], intermediate);
  auto out = stage("down", [&] {
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
