// fd_cpu_decode_attention (OPS §11): attention of decode / verify rows straight over the paged KV cache.
//
//   fd_cpu_decode_attention(q [N, nh, hd] float32, cache [blocks, block_size, 2, nkv, hd] float32 | bfloat16,
//                           ctx_rows [S, C] int64, token_seq [N] int32, token_len [N] int32, scale) -> [N, nh, hd]
//
// Token i attends to the cache rows ctx_rows[token_seq[i], 0 .. token_len[i] - 1] (row r = block * block_size +
// offset, so K of KV head j is cache[r][0][j], V is cache[r][1][j]); query head h reads KV head h / (nh / nkv).
// One (token, KV head) pair is one thread's whole job, so a token's output never depends on the other tokens or on
// the thread count. Each score is a float32 dot product (16 lanes, then their sum), times scale; the softmax is
// exp(s - max) / sum with glibc's vector expf; the output accumulates p * V in float32 and divides by the sum at
// the end.
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
#include "paged_cache.h"
#include "paddle/extension.h"

namespace {

using fd_cpu::lanes;
using fd_cpu::load16;

constexpr const char* kDecodeOp = "fd_cpu_decode_attention";
void require_decode(bool ok, const std::string& what) { fd_cpu::require(ok, kDecodeOp, what); }

// Tiles of the inner loops: a few query heads and context rows (scores) or query heads and 16-lane chunks of hd
// (p · V) at a time, so that one load of a cache vector feeds several independent FMA chains. Each score and each
// output lane is still one chain in the order the contract states (d, then t), so the tiling changes no bit.
constexpr int kTileQ = 4;   // query heads of one KV head
constexpr int kTileT = 4;   // context rows (scores)
constexpr int kTileD = 4;   // 16-lane chunks of hd (p · V)
// Context rows are prefetched ahead (hints only: no bit depends on them): a sequence's rows lie 2 * nkv * hd values
// apart, a few to a page, which the hardware prefetchers do not follow across pages. A job reads hd values of each
// row, so the distance is in bytes of the job's reads (at least 8 rows): a narrower head takes less time a row.
constexpr int64_t kAheadBytes = 4096;
inline int64_t rows_ahead(int64_t row_bytes) { return std::max<int64_t>(8, kAheadBytes / row_bytes); }

inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
}

// scores[u * len + t] for query heads u < NQ of q and context rows t0 .. t0 + NT - 1.
template <int NQ, int NT, typename T>
inline void score_tile(const float* q, const T* cache, const int64_t* rows, int64_t t0, int64_t len,
                       int64_t row_stride, int64_t k_offset, int64_t hd, float scale, float* scores, int64_t ahead) {
  __m512 acc[NQ][NT];
  const T* k[NT];
  #pragma GCC unroll 4
  for (int r = 0; r < NT; ++r) k[r] = cache + rows[t0 + r] * row_stride + k_offset;
  for (int64_t t = t0 + ahead; t < std::min(t0 + ahead + NT, len); ++t)
    prefetch_bytes(cache + rows[t] * row_stride + k_offset, hd * static_cast<int64_t>(sizeof(T)));
  #pragma GCC unroll 4
  for (int u = 0; u < NQ; ++u)
    #pragma GCC unroll 4
    for (int r = 0; r < NT; ++r) acc[u][r] = _mm512_setzero_ps();
  for (int64_t d = 0; d < hd; d += 16) {
    const __mmask16 m = lanes(hd - d);
    __m512 kd[NT];
    #pragma GCC unroll 4
    for (int r = 0; r < NT; ++r) kd[r] = load16(k[r] + d, m);
    #pragma GCC unroll 4
    for (int u = 0; u < NQ; ++u) {
      const __m512 qd = _mm512_maskz_loadu_ps(m, q + u * hd + d);
      #pragma GCC unroll 4
      for (int r = 0; r < NT; ++r) acc[u][r] = _mm512_fmadd_ps(qd, kd[r], acc[u][r]);
    }
  }
  #pragma GCC unroll 4
  for (int u = 0; u < NQ; ++u)
    #pragma GCC unroll 4
    for (int r = 0; r < NT; ++r) scores[u * len + t0 + r] = _mm512_reduce_add_ps(acc[u][r]) * scale;
}

// out[u * hd + d ...] += Σ_t p[u * len + t] · V[t] for query heads u < NQ and the ND chunks of hd from d0.
template <int NQ, int ND, typename T>
inline void value_tile(const float* p, const T* cache, const int64_t* rows, int64_t len, int64_t row_stride,
                       int64_t v_offset, int64_t hd, int64_t d0, float* out, const float* sums, int64_t ahead) {
  __m512 acc[NQ][ND];
  __mmask16 m[ND];
  #pragma GCC unroll 4
  for (int c = 0; c < ND; ++c) m[c] = lanes(hd - d0 - 16 * c);
  #pragma GCC unroll 4
  for (int u = 0; u < NQ; ++u)
    #pragma GCC unroll 4
    for (int c = 0; c < ND; ++c) acc[u][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    if (t + ahead < len)
      prefetch_bytes(cache + rows[t + ahead] * row_stride + v_offset + d0, ND * 16 * static_cast<int64_t>(sizeof(T)));
    const T* v = cache + rows[t] * row_stride + v_offset + d0;
    __m512 vd[ND];
    #pragma GCC unroll 4
    for (int c = 0; c < ND; ++c) vd[c] = load16(v + 16 * c, m[c]);
    #pragma GCC unroll 4
    for (int u = 0; u < NQ; ++u) {
      const __m512 pu = _mm512_set1_ps(p[u * len + t]);
      #pragma GCC unroll 4
      for (int c = 0; c < ND; ++c) acc[u][c] = _mm512_fmadd_ps(pu, vd[c], acc[u][c]);
    }
  }
  #pragma GCC unroll 4
  for (int u = 0; u < NQ; ++u)
    #pragma GCC unroll 4
    for (int c = 0; c < ND; ++c)
      _mm512_mask_storeu_ps(out + u * hd + d0 + 16 * c, m[c], _mm512_div_ps(acc[u][c], _mm512_set1_ps(sums[u])));
}

// s[t] <- exp(s[t] - max s) for t < len, and *sum <- their sum: 16 lanes at a time through glibc's AVX-512 expf
// (libmvec, within 4 ulp of expf), the sum as 16 lane sums in t order, then their sum.
inline void softmax_numerators(float* s, int64_t len, float* sum) {
  __m512 top = _mm512_set1_ps(-INFINITY);
  for (int64_t t = 0; t < len; t += 16) {
    const __mmask16 m = lanes(len - t);
    top = _mm512_mask_max_ps(top, m, top, _mm512_maskz_loadu_ps(m, s + t));
  }
  const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  __m512 total = _mm512_setzero_ps();
  for (int64_t t = 0; t < len; t += 16) {
    const __mmask16 m = lanes(len - t);
    const __m512 e = _ZGVeN16v_expf(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + t), shift));
    _mm512_mask_storeu_ps(s + t, m, e);
    total = _mm512_mask_add_ps(total, m, total, e);
  }
  *sum = _mm512_reduce_add_ps(total);
}

// F<n>() for a run-time n in 1 .. 4 (a tile's edge is narrower than the tile).
template <template <int> class F, typename... A>
inline void by_width(int n, A&&... a) {
  switch (n) {
    case 1: F<1>::run(a...); break;
    case 2: F<2>::run(a...); break;
    case 3: F<3>::run(a...); break;
    default: F<4>::run(a...); break;
  }
}

template <typename T>
struct Scores {
  template <int NQ>
  struct Q {
    static void run(int nt, const float* q, const T* cache, const int64_t* rows, int64_t t0, int64_t len,
                    int64_t row_stride, int64_t k_offset, int64_t hd, float scale, float* scores, int64_t ahead) {
      if (nt == kTileT)
        score_tile<NQ, kTileT>(q, cache, rows, t0, len, row_stride, k_offset, hd, scale, scores, ahead);
      else   // the last rows, one at a time
        for (int r = 0; r < nt; ++r)
          score_tile<NQ, 1>(q, cache, rows, t0 + r, len, row_stride, k_offset, hd, scale, scores, ahead);
    }
  };
};

template <typename T, int NQ>
struct Values {
  template <int ND>
  struct D {
    static void run(const float* p, const T* cache, const int64_t* rows, int64_t len, int64_t row_stride,
                    int64_t v_offset, int64_t hd, int64_t d0, float* out, const float* sums, int64_t ahead) {
      value_tile<NQ, ND>(p, cache, rows, len, row_stride, v_offset, hd, d0, out, sums, ahead);
    }
  };
  static void run(int nd, const float* p, const T* cache, const int64_t* rows, int64_t len, int64_t row_stride,
                  int64_t v_offset, int64_t hd, int64_t d0, float* out, const float* sums, int64_t ahead) {
    by_width<D>(nd, p, cache, rows, len, row_stride, v_offset, hd, d0, out, sums, ahead);
  }
};

template <typename T>
struct ValuesQ {
  template <int NQ>
  struct Q {
    template <typename... A>
    static void run(A... a) { Values<T, NQ>::run(a...); }
  };
};

template <typename T>
void attend_pair(const float* q, const T* cache, const int64_t* rows, int64_t len, int64_t nkv, int64_t hd,
                 int64_t g, int64_t j, float scale, float* out, std::vector<float>& scores) {
  scores.resize(static_cast<size_t>(g * len + g));
  float* sums = scores.data() + g * len;
  const int64_t row_stride = 2 * nkv * hd, ahead = rows_ahead(hd * static_cast<int64_t>(sizeof(T)));
  for (int64_t u0 = 0; u0 < g; u0 += kTileQ) {
    const int nq = static_cast<int>(std::min<int64_t>(kTileQ, g - u0));
    for (int64_t t0 = 0; t0 < len; t0 += kTileT)
      by_width<Scores<T>::template Q>(nq, static_cast<int>(std::min<int64_t>(kTileT, len - t0)), q + u0 * hd, cache,
                                      rows, t0, len, row_stride, j * hd, hd, scale, scores.data() + u0 * len,
                                      ahead);
  }
  for (int64_t u = 0; u < g; ++u) softmax_numerators(scores.data() + u * len, len, sums + u);
  const int64_t chunks = (hd + 15) / 16;
  for (int64_t u0 = 0; u0 < g; u0 += kTileQ) {
    const int nq = static_cast<int>(std::min<int64_t>(kTileQ, g - u0));
    for (int64_t c0 = 0; c0 < chunks; c0 += kTileD)
      by_width<ValuesQ<T>::template Q>(nq, static_cast<int>(std::min<int64_t>(kTileD, chunks - c0)),
                                       scores.data() + u0 * len, cache, rows, len, row_stride, (nkv + j) * hd, hd,
                                       16 * c0, out + u0 * hd, sums + u0, ahead);
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
  require_decode(fd_cpu::has_dpbf16(), "this CPU lacks the AVX-512 the kernel is built for");
  require_decode(q.is_cpu() && q.dtype() == paddle::DataType::FLOAT32 && q.shape().size() == 3,
                 "argument 'q' must be a float32 CPU tensor [N, nh, hd]");
  const int64_t n = q.shape()[0], nh = q.shape()[1], hd = q.shape()[2];
  const auto layer = fd_cpu::check_cache(kDecodeOp, cache, hd);
  const int64_t nkv = layer.nkv;
  require_decode(nh % nkv == 0, "argument 'q': its heads must be a multiple of the cache's KV heads");
  require_decode(ctx_rows.dtype() == paddle::DataType::INT64 && ctx_rows.shape().size() == 2,
                 "argument 'ctx_rows' must be int64 [S, C]");
  require_decode(token_seq.dtype() == paddle::DataType::INT32 && token_len.dtype() == paddle::DataType::INT32 &&
                     token_seq.numel() == n && token_len.numel() == n,
                 "arguments 'token_seq', 'token_len' must be int32 [N]");
  const int64_t seqs = ctx_rows.shape()[0], cmax = ctx_rows.shape()[1];
  const int64_t* rows = ctx_rows.data<int64_t>();
  const int32_t* seq = token_seq.data<int32_t>();
  const int32_t* len = token_len.data<int32_t>();
  // a bad index would read outside the cache: every one is checked (the message is built only for a bad one)
  for (int64_t i = 0; i < n; ++i) {
    if (seq[i] < 0 || seq[i] >= seqs)
      require_decode(false, "argument 'token_seq' holds " + std::to_string(seq[i]) + ", not a row");
    if (len[i] < 1 || len[i] > cmax)
      require_decode(false, "argument 'token_len' holds " + std::to_string(len[i]) + ", outside [1, " +
                                std::to_string(cmax) + "]");
    fd_cpu::check_rows(kDecodeOp, "ctx_rows", rows + seq[i] * cmax, len[i], layer.rows);
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
