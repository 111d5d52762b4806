// fd_cpu_prefill_attention (OPS §11.3): causal attention of one sequence's prefill chunk straight over the paged KV
// cache, in blocks of keys with a running softmax (the "flash" order), the block products through oneDNN's sgemm.
//
//   fd_cpu_prefill_attention(q [T, nh, hd] float32, cache [blocks, block_size, 2, nkv, hd] float32 | bfloat16,
//                            ctx_rows [C] int64, scale) -> [T, nh, hd]
//
// The chunk's T queries are the context's last T positions (C - T .. C - 1); the query at position p attends to
// positions 0 .. p, K and V of position t read from cache row ctx_rows[t]. Keys are taken in blocks of kKeys
// positions at fixed offsets (0, kKeys, 2 kKeys, ...), so what a query row computes depends on its position and
// the context, not on where the chunk starts or which rows share its tile. One (KV head, tile of kRows query
// positions) pair is one thread's whole job: the g query heads of the KV head over those positions are g * kRows
// rows of one product against a block of keys, read from the cache once per block into a contiguous float32 copy.
#pragma GCC target("avx512f,avx512bw,avx512vl")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"   // GCC 12's intrinsics header (see decode_attention.cc)

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <dnnl.h>

#include "dpbf16_linear.h"
#include "paged_cache.h"
#include "paddle/extension.h"

namespace {

using fd_cpu::lanes;

constexpr int64_t kRows = 128;   // query positions of one tile (times g query heads: the product's rows)
constexpr int64_t kKeys = 256;   // key positions of one block
constexpr int64_t kMinRows = 16;  // the fewest rows of a product (a tile's g * rows, padded)

constexpr const char* kPrefillOp = "fd_cpu_prefill_attention";
void require_prefill(bool ok, const std::string& what) { fd_cpu::require(ok, kPrefillOp, what); }

// dst [n] float32 <- src [n] (a cache vector; bfloat16 widened exactly).
template <typename T>
inline void widen(const T* src, int64_t n, float* dst) {
  for (int64_t d = 0; d < n; d += 16) {
    const __mmask16 m = lanes(n - d);
    _mm512_mask_storeu_ps(dst + d, m, fd_cpu::load16(src + d, m));
  }
}

void sgemm(char transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  const dnnl_status_t status = dnnl_sgemm('N', transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  require_prefill(status == dnnl_success, "oneDNN's sgemm failed with status " + std::to_string(status));
}

// One score row s[0 .. len - 1] of a block whose first `valid` keys are at or before the query's position (the
// rest after it; the first block always has one): folds the block into the row's running max *top and sum *sum,
// leaves exp(s - new max) in s[0 .. len - 1] (0 past valid), and returns the factor exp(old max - new max) that the
// row's output accumulated so far must take.
inline float fold_row(float* s, int64_t valid, int64_t len, float* top, float* sum) {
  __m512 most = _mm512_set1_ps(-INFINITY);
  for (int64_t t = 0; t < valid; t += 16) {
    const __mmask16 m = lanes(valid - t);
    most = _mm512_mask_max_ps(most, m, most, _mm512_maskz_loadu_ps(m, s + t));
  }
  const float new_top = std::max(*top, _mm512_reduce_max_ps(most));
  const float rescale = *top == -INFINITY ? 0.0f : std::exp(*top - new_top);
  const __m512 shift = _mm512_set1_ps(new_top);
  __m512 total = _mm512_setzero_ps();
  for (int64_t t = 0; t < valid; t += 16) {
    const __mmask16 m = lanes(valid - t);
    const __m512 e = _ZGVeN16v_expf(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + t), shift));
    _mm512_mask_storeu_ps(s + t, m, e);
    total = _mm512_mask_add_ps(total, m, total, e);
  }
  if (valid < len) std::memset(s + valid, 0, (len - valid) * sizeof(float));
  *sum = *sum * rescale + _mm512_reduce_add_ps(total);
  *top = new_top;
  return rescale;
}

// One thread's scratch for tiles of at most `rows` product rows (sized to the chunk: a short one needs few).
struct Buffers {
  std::vector<float> q, scores, keys, values, out, top, sum;
  Buffers(int64_t rows, int64_t hd)
      : q(rows * hd), scores(rows * kKeys), keys(kKeys * hd), values(kKeys * hd), out(rows * hd), top(rows),
        sum(rows) {}
};

// Query positions of a tile's product, a short tile padded to kMinRows product rows (see attend_tile).
inline int64_t padded_positions(int64_t real, int64_t g) { return std::max(real, (kMinRows + g - 1) / g); }

// Tile (KV head j, query positions t0 .. t0 + real - 1 of the chunk, at context positions past + t0 ...).
template <typename T>
void attend_tile(const float* q, const T* cache, const int64_t* ctx_rows, int64_t past, int64_t t0, int64_t real,
                 int64_t nh, int64_t nkv, int64_t hd, int64_t j, float scale, float* out, Buffers& b) {
  const int64_t g = nh / nkv, row_stride = 2 * nkv * hd;
  // oneDNN's sgemm sums a product of fewer than kMinRows rows in another order (measured): a short tile is padded
  // with zero queries, computed and dropped, so a row's bits never depend on how many rows share its tile
  const int64_t n = padded_positions(real, g), rows = g * n;
  // product row u * n + r: query head j * g + u at chunk position t0 + r
  std::fill(b.q.begin(), b.q.begin() + rows * hd, 0.0f);
  for (int64_t u = 0; u < g; ++u)
    for (int64_t r = 0; r < real; ++r)
      std::memcpy(b.q.data() + (u * n + r) * hd, q + ((t0 + r) * nh + j * g + u) * hd, hd * sizeof(float));
  std::fill(b.out.begin(), b.out.begin() + rows * hd, 0.0f);
  std::fill(b.top.begin(), b.top.begin() + rows, -INFINITY);
  std::fill(b.sum.begin(), b.sum.begin() + rows, 0.0f);
  const int64_t first = past + t0, end = first + real;   // the tile's positions; keys 0 .. end - 1 reach it
  for (int64_t k0 = 0; k0 < end; k0 += kKeys) {
    // every block is kKeys long, zeros past the tile's last position (their scores are masked): the products'
    // shapes, hence their order of sums, are the same for a query row wherever its tile ends
    const int64_t len = std::min(kKeys, end - k0);
    for (int64_t t = 0; t < len; ++t) {
      const T* row = cache + ctx_rows[k0 + t] * row_stride;
      widen(row + j * hd, hd, b.keys.data() + t * hd);
      widen(row + (nkv + j) * hd, hd, b.values.data() + t * hd);
    }
    std::fill(b.keys.begin() + len * hd, b.keys.end(), 0.0f);
    std::fill(b.values.begin() + len * hd, b.values.end(), 0.0f);
    sgemm('T', rows, kKeys, hd, scale, b.q.data(), hd, b.keys.data(), hd, 0.0f, b.scores.data(), kKeys);
    for (int64_t u = 0; u < g; ++u)
      for (int64_t r = 0; r < n; ++r) {
        const int64_t row = u * n + r;
        // keys of the block at or before the row's position (none where the block starts after it)
        const int64_t valid = std::clamp<int64_t>(first + r - k0 + 1, 0, len);
        const float rescale = fold_row(b.scores.data() + row * kKeys, valid, kKeys, &b.top[row], &b.sum[row]);
        if (rescale != 1.0f) {
          float* o = b.out.data() + row * hd;
          for (int64_t d = 0; d < hd; ++d) o[d] *= rescale;
        }
      }
    sgemm('N', rows, hd, kKeys, 1.0f, b.scores.data(), kKeys, b.values.data(), hd, 1.0f, b.out.data(), hd);
  }
  for (int64_t u = 0; u < g; ++u)
    for (int64_t r = 0; r < real; ++r) {
      const float* o = b.out.data() + (u * n + r) * hd;
      const float inv = 1.0f / b.sum[u * n + r];
      float* dst = out + ((t0 + r) * nh + j * g + u) * hd;
      for (int64_t d = 0; d < hd; ++d) dst[d] = o[d] * inv;
    }
}

template <typename T>
void attend(const float* q, const T* cache, const int64_t* ctx_rows, int64_t c, int64_t t_len, int64_t nh,
            int64_t nkv, int64_t hd, float scale, float* out) {
  const int64_t tiles = (t_len + kRows - 1) / kRows, past = c - t_len, g = nh / nkv;
#pragma omp parallel
  {
    Buffers buffers(g * padded_positions(std::min(kRows, t_len), g), hd);
    // the last tiles see the most keys: taken first, handed out one at a time
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < tiles * nkv; ++item) {
      const int64_t tile = tiles - 1 - item / nkv, j = item % nkv, t0 = tile * kRows;
      attend_tile(q, cache, ctx_rows, past, t0, std::min(kRows, t_len - t0), nh, nkv, hd, j, scale, out, buffers);
    }
  }
}

}  // namespace

std::vector<paddle::Tensor> PrefillAttention(const paddle::Tensor& q, const paddle::Tensor& cache,
                                             const paddle::Tensor& ctx_rows, float scale) {
  require_prefill(fd_cpu::has_dpbf16(), "this CPU lacks the AVX-512 the kernel is built for");
  require_prefill(q.is_cpu() && q.dtype() == paddle::DataType::FLOAT32 && q.shape().size() == 3,
                  "argument 'q' must be a float32 CPU tensor [T, nh, hd]");
  const int64_t t_len = q.shape()[0], nh = q.shape()[1], hd = q.shape()[2];
  const auto layer = fd_cpu::check_cache(kPrefillOp, cache, hd);
  const int64_t nkv = layer.nkv;
  require_prefill(nh % nkv == 0, "argument 'q': its heads must be a multiple of the cache's KV heads");
  require_prefill(ctx_rows.is_cpu() && ctx_rows.dtype() == paddle::DataType::INT64 && ctx_rows.shape().size() == 1,
                  "argument 'ctx_rows' must be an int64 CPU tensor [C]");
  const int64_t c = ctx_rows.shape()[0];
  require_prefill(t_len >= 1 && t_len <= c, "argument 'q' has " + std::to_string(t_len) + " rows; the context has " +
                                                std::to_string(c) + " positions (the queries are its last ones)");
  const int64_t* rows = ctx_rows.data<int64_t>();
  fd_cpu::check_rows(kPrefillOp, "ctx_rows", rows, c, layer.rows);
  auto out = paddle::empty({t_len, nh, hd}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  if (cache.dtype() == paddle::DataType::FLOAT32)
    attend(q.data<float>(), cache.data<float>(), rows, c, t_len, nh, nkv, hd, scale, out.data<float>());
  else
    attend(q.data<float>(), reinterpret_cast<const uint16_t*>(cache.data()), rows, c, t_len, nh, nkv, hd, scale,
           out.data<float>());
  return {out};
}

std::vector<std::vector<int64_t>> PrefillAttentionShape(const std::vector<int64_t>& q, const std::vector<int64_t>&,
                                                        const std::vector<int64_t>&, float) {
  return {q};
}
std::vector<paddle::DataType> PrefillAttentionDtype(const paddle::DataType&, const paddle::DataType&,
                                                    const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_cpu_prefill_attention)
    .Inputs({"q", "cache", "ctx_rows"})
    .Outputs({"out"})
    .Attrs({"scale: float"})
    .SetInferShapeFn(PD_INFER_SHAPE(PrefillAttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(PrefillAttentionDtype))
    .SetKernelFn(PD_KERNEL(PrefillAttention));
