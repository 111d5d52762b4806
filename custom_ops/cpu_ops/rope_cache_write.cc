// fd_cpu_rope_cache_write (OPS §11.2): the rotary embedding of a decode pass's q and k heads and the write of its K
// and V into the paged cache, in one op.
//
//   fd_cpu_rope_cache_write(qkv [M, (nh + 2 nkv) hd] float32, cos [M, 1, hd] float32, sin [M, 1, hd] float32,
//                           cache [blocks, block_size, 2, nkv, hd] float32 | bfloat16, rows [M] int64,
//                           num_heads, interleaved) -> q [M, nh, hd]
//
// Heads h < nh of row m are q, the next nkv are k, the last nkv are v. Each q and k head x is rotated as
// layers/rotary.py does it, x * cos + partner(x) * sin over the spread tables (partner(x)[i] = x[i ± hd/2] for
// "neox", x[i ^ 1] for "interleaved"), as two float32 products and one sum: the extension is compiled with
// -ffp-contract=off, so no FMA fuses them and the result is Paddle's three elementwise ops bit for bit. q is
// returned; the rotated k and the v heads go to cache row rows[m] (K at [.., 0, j], V at [.., 1, j]), rounded to
// nearest even for a bfloat16 cache, as Paddle's cast rounds.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

#include <immintrin.h>

#include <cstring>
#include <string>
#include <vector>

#include "dpbf16_linear.h"
#include "paged_cache.h"
#include "paddle/extension.h"

namespace {

constexpr const char* kRopeOp = "fd_cpu_rope_cache_write";
void require_rope(bool ok, const std::string& what) { fd_cpu::require(ok, kRopeOp, what); }

// out[i] = x[i] * cos[i] + x[partner(i)] * sin[i], i < hd
void rotate(const float* x, const float* cos, const float* sin, int64_t hd, bool interleaved, float* out) {
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < hd; ++i) {
    const int64_t partner = interleaved ? (i ^ 1) : (i < half ? i + half : i - half);
    const float a = x[i] * cos[i];
    const float b = x[partner] * sin[i];
    out[i] = a + b;
  }
}

void store(const float* values, int64_t n, float* dst) { std::memcpy(dst, values, n * sizeof(float)); }

void store(const float* values, int64_t n, uint16_t* dst) {   // float32 -> bfloat16, round to nearest even
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(values + i))));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(dst + i, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, values + i))));
  }
}

template <typename T>
void run(const float* qkv, const float* cos, const float* sin, T* cache, const int64_t* rows, int64_t m, int64_t nh,
         int64_t nkv, int64_t hd, bool interleaved, float* q) {
  const int64_t width = (nh + 2 * nkv) * hd, row_stride = 2 * nkv * hd;
  std::vector<float> k(hd);
  for (int64_t r = 0; r < m; ++r) {
    const float* x = qkv + r * width;
    const float* c = cos + r * hd;
    const float* s = sin + r * hd;
    for (int64_t h = 0; h < nh; ++h) rotate(x + h * hd, c, s, hd, interleaved, q + (r * nh + h) * hd);
    T* row = cache + rows[r] * row_stride;
    for (int64_t j = 0; j < nkv; ++j) {
      rotate(x + (nh + j) * hd, c, s, hd, interleaved, k.data());
      store(k.data(), hd, row + j * hd);
      store(x + (nh + nkv + j) * hd, hd, row + (nkv + j) * hd);
    }
  }
}

}  // namespace

std::vector<paddle::Tensor> RopeCacheWrite(const paddle::Tensor& qkv, const paddle::Tensor& cos,
                                           const paddle::Tensor& sin, const paddle::Tensor& cache,
                                           const paddle::Tensor& rows, int64_t num_heads, bool interleaved) {
  require_rope(fd_cpu::has_dpbf16(), "this CPU lacks the AVX-512 the kernel is built for");
  const auto layer = fd_cpu::check_cache(kRopeOp, cache);
  const int64_t nkv = layer.nkv, hd = layer.hd, nh = num_heads;
  require_rope(nh > 0 && nh % nkv == 0 && hd % 2 == 0,
               "attribute 'num_heads' must be a positive multiple of the cache's KV heads, and the head size even");
  require_rope(qkv.is_cpu() && qkv.dtype() == paddle::DataType::FLOAT32 && qkv.shape().size() == 2 &&
                   qkv.shape()[1] == (nh + 2 * nkv) * hd,
               "argument 'qkv' must be a float32 CPU tensor [M, (num_heads + 2 nkv) * head_dim]");
  const int64_t m = qkv.shape()[0];
  for (const auto* table : {&cos, &sin})
    require_rope(table->is_cpu() && table->dtype() == paddle::DataType::FLOAT32 && table->numel() == m * hd,
                 "arguments 'cos', 'sin' must be float32 CPU tensors [M, 1, head_dim]");
  require_rope(rows.is_cpu() && rows.dtype() == paddle::DataType::INT64 && rows.numel() == m,
               "argument 'rows' must be an int64 CPU tensor [M]");
  const int64_t* row = rows.data<int64_t>();
  fd_cpu::check_rows(kRopeOp, "rows", row, m, layer.rows);
  // the op writes into the cache's own storage (it is updated in place, as KVCache.write_rows updates it)
  auto q = paddle::empty({m, nh, hd}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  void* storage = const_cast<void*>(cache.data());
  if (cache.dtype() == paddle::DataType::FLOAT32)
    run(qkv.data<float>(), cos.data<float>(), sin.data<float>(), static_cast<float*>(storage), row, m, nh, nkv, hd,
        interleaved, q.data<float>());
  else
    run(qkv.data<float>(), cos.data<float>(), sin.data<float>(), static_cast<uint16_t*>(storage), row, m, nh, nkv,
        hd, interleaved, q.data<float>());
  return {q};
}

std::vector<std::vector<int64_t>> RopeCacheWriteShape(const std::vector<int64_t>& qkv, const std::vector<int64_t>&,
                                                      const std::vector<int64_t>&, const std::vector<int64_t>& cache,
                                                      const std::vector<int64_t>&, int64_t num_heads, bool) {
  return {{qkv[0], num_heads, cache[4]}};
}
std::vector<paddle::DataType> RopeCacheWriteDtype(const paddle::DataType&, const paddle::DataType&,
                                                  const paddle::DataType&, const paddle::DataType&,
                                                  const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_cpu_rope_cache_write)
    .Inputs({"qkv", "cos", "sin", "cache", "rows"})
    .Outputs({"q"})
    .Attrs({"num_heads: int64_t", "interleaved: bool"})
    .SetInferShapeFn(PD_INFER_SHAPE(RopeCacheWriteShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RopeCacheWriteDtype))
    .SetKernelFn(PD_KERNEL(RopeCacheWrite));
