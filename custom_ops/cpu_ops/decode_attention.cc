// fd_cpu_decode_attention (OPS §11): attention of decode / verify rows straight over the paged KV cache.
//
//   fd_cpu_decode_attention(q [N, nh, hd] float32, cache [blocks, block_size, 2, nkv, hd] float32 | bfloat16,
//                           ctx_rows [S, C] int64, token_seq [N] int32, token_len [N] int32, scale) -> [N, nh, hd]
//
// Token i attends to the cache rows ctx_rows[token_seq[i], 0 .. token_len[i] - 1] (row r = block * block_size +
// offset, so K of KV head j is cache[r][0][j], V is cache[r][1][j]); query head h reads KV head h / (nh / nkv).
// One (token, KV head) pair is one thread's whole job, so a token's output never depends on the other tokens or on
// the thread count. Each score is a float32 dot product (16 lanes, then their sum), times scale; the softmax is
// exp(s - max) / sum with float32 expf; the output accumulates p * V in float32 and divides by the sum at the end.
#pragma GCC target("avx512f,avx512bw,avx512vl")
// GCC 12's own intrinsics header trips this warning (its `__m512 __Y = __Y;` idiom for an undefined vector)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dpbf16_linear.h"
#include "paddle/extension.h"

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) PD_THROW("fd_cpu_decode_attention: " + what);
}

inline __mmask16 lanes(int64_t remaining) {
  return static_cast<__mmask16>(remaining >= 16 ? 0xFFFF : (1u << remaining) - 1);
}

// 16 float32 values of a cache vector from d (masked past the end).
inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load(const uint16_t* p, __mmask16 m) {
  const __m256i bits = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));   // bf16 -> float32, exact
}

template <typename T>
void attend_pair(const float* q, const T* cache, const int64_t* rows, int64_t len, int64_t nkv, int64_t hd,
                 int64_t g, int64_t j, float scale, float* out, std::vector<float>& scores) {
  scores.resize(static_cast<size_t>(g * len));
  const int64_t row_stride = 2 * nkv * hd;
  for (int64_t t = 0; t < len; ++t) {
    const T* k = cache + rows[t] * row_stride + j * hd;
    for (int64_t i = 0; i < g; ++i) {
      const float* qi = q + i * hd;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t d = 0; d < hd; d += 16) {
        const __mmask16 m = lanes(hd - d);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qi + d), load(k + d, m), acc);
      }
      scores[i * len + t] = _mm512_reduce_add_ps(acc) * scale;
    }
  }
  for (int64_t i = 0; i < g; ++i) {
    float* s = scores.data() + i * len;
    const float top = *std::max_element(s, s + len);
    float sum = 0.0f;
    for (int64_t t = 0; t < len; ++t) {
      s[t] = expf(s[t] - top);
      sum += s[t];
    }
    float* o = out + i * hd;
    for (int64_t d = 0; d < hd; d += 16) {
      const __mmask16 m = lanes(hd - d);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t t = 0; t < len; ++t) {
        const T* v = cache + rows[t] * row_stride + (nkv + j) * hd;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(s[t]), load(v + d, m), acc);
      }
      _mm512_mask_storeu_ps(o + d, m, _mm512_div_ps(acc, _mm512_set1_ps(sum)));
    }
  }
}

template <typename T>
void attend(const float* q, const T* cache, const int64_t* ctx_rows, int64_t cmax, const int32_t* token_seq,
            const int32_t* token_len, int64_t n, int64_t nh, int64_t nkv, int64_t hd, float scale, float* out) {
  const int64_t g = nh / nkv;
#pragma omp parallel
  {
    std::vector<float> scores;
#pragma omp for schedule(static)
    for (int64_t pair = 0; pair < n * nkv; ++pair) {
      const int64_t i = pair / nkv, j = pair % nkv;
      attend_pair(q + (i * nh + j * g) * hd, cache, ctx_rows + token_seq[i] * cmax, token_len[i], nkv, hd, g, j,
                  scale, out + (i * nh + j * g) * hd, scores);
    }
  }
}

}  // namespace

std::vector<paddle::Tensor> DecodeAttention(const paddle::Tensor& q, const paddle::Tensor& cache,
                                            const paddle::Tensor& ctx_rows, const paddle::Tensor& token_seq,
                                            const paddle::Tensor& token_len, float scale) {
  require(fd_cpu::has_dpbf16(), "this CPU lacks the AVX-512 the kernel is built for");
  require(q.is_cpu() && q.dtype() == paddle::DataType::FLOAT32 && q.shape().size() == 3,
          "argument 'q' must be a float32 CPU tensor [N, nh, hd]");
  const int64_t n = q.shape()[0], nh = q.shape()[1], hd = q.shape()[2];
  const auto& cs = cache.shape();
  require(cache.is_cpu() && cs.size() == 5 && cs[2] == 2 && cs[4] == hd &&
              (cache.dtype() == paddle::DataType::FLOAT32 || cache.dtype() == paddle::DataType::BFLOAT16),
          "argument 'cache' must be a float32 or bfloat16 CPU tensor [blocks, block_size, 2, nkv, hd]");
  const int64_t nkv = cs[3], cache_rows = cs[0] * cs[1];
  require(nkv > 0 && nh % nkv == 0, "argument 'q': its heads must be a multiple of the cache's KV heads");
  require(ctx_rows.dtype() == paddle::DataType::INT64 && ctx_rows.shape().size() == 2,
          "argument 'ctx_rows' must be int64 [S, C]");
  require(token_seq.dtype() == paddle::DataType::INT32 && token_len.dtype() == paddle::DataType::INT32 &&
              token_seq.numel() == n && token_len.numel() == n,
          "arguments 'token_seq', 'token_len' must be int32 [N]");
  const int64_t seqs = ctx_rows.shape()[0], cmax = ctx_rows.shape()[1];
  const int64_t* rows = ctx_rows.data<int64_t>();
  const int32_t* seq = token_seq.data<int32_t>();
  const int32_t* len = token_len.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    require(seq[i] >= 0 && seq[i] < seqs, "argument 'token_seq' holds " + std::to_string(seq[i]) + ", not a row");
    require(len[i] >= 1 && len[i] <= cmax, "argument 'token_len' holds " + std::to_string(len[i]) +
                                               ", outside [1, " + std::to_string(cmax) + "]");
    for (int64_t t = 0; t < len[i]; ++t) {
      const int64_t r = rows[seq[i] * cmax + t];
      require(r >= 0 && r < cache_rows, "argument 'ctx_rows' holds row " + std::to_string(r) + " of a cache of " +
                                            std::to_string(cache_rows));
    }
  }
  auto out = paddle::empty({n, nh, hd}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  if (cache.dtype() == paddle::DataType::FLOAT32)
    attend(q.data<float>(), cache.data<float>(), rows, cmax, seq, len, n, nh, nkv, hd, scale, out.data<float>());
  else
    attend(q.data<float>(), reinterpret_cast<const uint16_t*>(cache.data()), rows, cmax, seq, len, n, nh, nkv, hd,
           scale, out.data<float>());
  return {out};
}

std::vector<std::vector<int64_t>> DecodeAttentionShape(const std::vector<int64_t>& q, const std::vector<int64_t>&,
                                                       const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                       const std::vector<int64_t>&, float) {
  return {q};
}
std::vector<paddle::DataType> DecodeAttentionDtype(const paddle::DataType&, const paddle::DataType&,
                                                   const paddle::DataType&, const paddle::DataType&,
                                                   const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_cpu_decode_attention)
    .Inputs({"q", "cache", "ctx_rows", "token_seq", "token_len"})
    .Outputs({"out"})
    .Attrs({"scale: float"})
    .SetInferShapeFn(PD_INFER_SHAPE(DecodeAttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DecodeAttentionDtype))
    .SetKernelFn(PD_KERNEL(DecodeAttention));
