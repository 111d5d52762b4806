// fd_cpu_rms_norm (OPS §12): RMSNorm of float32 rows, optionally after adding a residual, in this extension's
// OpenMP runtime.
//
//   fd_cpu_rms_norm(x [..., H] float32, weight [H] float32, residual [..., H] float32 or [0], eps)
//       -> out [..., H], residual_out [..., H] (x + residual; [0] without a residual)
//
// The arithmetic is Paddle's CPU `fused_rms_norm` kernel's, bit for bit: per row, s = x (+ residual), the squares
// summed in 16 lanes (lane l takes columns l, l + 16, ...; one FMA a step) and the lanes by
// `_mm512_reduce_add_ps`, inv = 1 / sqrt(sum / H + eps) in float32, out = (s * inv) * weight + 0. Why an own op
// for it: Paddle's kernel opens an Intel OpenMP parallel region for every call, one row or many, and in a decode
// step at two threads its worker wakes on the core this extension's GNU OpenMP team is still spinning on: measured
// tens to hundreds of us a norm instead of 4 (docs/benchmarks.md "One OpenMP runtime in a decode step"). Rows are split
// over threads only when there are enough of them to pay for it.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

#include <immintrin.h>

#include <cmath>
#include <string>
#include <vector>

#include "dpbf16_linear.h"
#include "paged_cache.h"
#include "paddle/extension.h"

namespace {

constexpr const char* kNormOp = "fd_cpu_rms_norm";
constexpr int64_t kParallelElements = int64_t{1} << 16;   // below this a parallel region costs more than it saves

void require_norm(bool ok, const std::string& what) { fd_cpu::require(ok, kNormOp, what); }

// One row of h columns; res / res_out null without a residual.
void norm_row(const float* x, const float* res, const float* w, int64_t h, float eps, float* out, float* res_out) {
  __m512 squares = _mm512_setzero_ps();
  for (int64_t c = 0; c < h; c += 16) {
    const __mmask16 m = fd_cpu::lanes(h - c);
    __m512 v = _mm512_maskz_loadu_ps(m, x + c);
    if (res) {
      v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, res + c));
      _mm512_mask_storeu_ps(res_out + c, m, v);
    }
    squares = _mm512_fmadd_ps(v, v, squares);
  }
  const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(h) + eps);
  const __m512 scale = _mm512_set1_ps(inv);
  const float* s = res ? res_out : x;
  for (int64_t c = 0; c < h; c += 16) {
    const __mmask16 m = fd_cpu::lanes(h - c);
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + c), scale),
                                   _mm512_maskz_loadu_ps(m, w + c));
    _mm512_mask_storeu_ps(out + c, m, _mm512_add_ps(y, _mm512_setzero_ps()));   // + 0: -0 becomes +0, as Paddle's
  }
}

bool is_f32(const paddle::Tensor& t) { return t.is_cpu() && t.dtype() == paddle::DataType::FLOAT32; }

}  // namespace

std::vector<paddle::Tensor> RmsNorm(const paddle::Tensor& x, const paddle::Tensor& weight,
                                    const paddle::Tensor& residual, float eps) {
  require_norm(fd_cpu::has_dpbf16(), "this CPU lacks the AVX-512 the kernel is built for");
  require_norm(is_f32(x) && !x.shape().empty() && x.shape().back() > 0,
               "argument 'x' must be a float32 CPU tensor [..., H], H > 0");
  const int64_t h = x.shape().back(), rows = x.numel() / h;
  require_norm(is_f32(weight) && weight.numel() == h, "argument 'weight' must be a float32 CPU tensor [H]");
  const bool has_res = residual.shape() == x.shape();   // by shape, not size: x may have no rows
  require_norm(is_f32(residual) && (has_res || residual.shape() == std::vector<int64_t>{0}),
               "argument 'residual' must be a float32 CPU tensor of x's shape, or [0]");
  auto out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  auto res_out = paddle::empty(has_res ? x.shape() : std::vector<int64_t>{0}, paddle::DataType::FLOAT32,
                               paddle::CPUPlace());
  const float* xs = x.data<float>();
  const float* rs = has_res ? residual.data<float>() : nullptr;
  const float* w = weight.data<float>();
  float* os = out.data<float>();
  float* ros = has_res ? res_out.data<float>() : nullptr;
#pragma omp parallel for if (rows * h >= kParallelElements && rows > 1)
  for (int64_t r = 0; r < rows; ++r)
    norm_row(xs + r * h, rs ? rs + r * h : nullptr, w, h, eps, os + r * h, ros ? ros + r * h : nullptr);
  return {out, res_out};
}

std::vector<std::vector<int64_t>> RmsNormShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                               const std::vector<int64_t>& residual, float) {
  return {x, residual};
}
std::vector<paddle::DataType> RmsNormDtype(const paddle::DataType&, const paddle::DataType&,
                                           const paddle::DataType&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_cpu_rms_norm)
    .Inputs({"x", "weight", "residual"})
    .Outputs({"out", "residual_out"})
    .Attrs({"eps: float"})
    .SetInferShapeFn(PD_INFER_SHAPE(RmsNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RmsNormDtype))
    .SetKernelFn(PD_KERNEL(RmsNorm));
