// What the CPU ops over the paged KV cache share (OPS §11): the checks of a cache layer and of the rows an op
// reads or writes, and the AVX-512 helpers for its float32 / bfloat16 vectors; and how the ops made of other ops
// (OPS §13) name a stage's error. Include it after the source's
// `#pragma GCC target` (AVX-512).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "paddle/extension.h"

extern "C" __m512 _ZGVeN16v_expf(__m512);   // glibc's libmvec: expf over 16 lanes (within 4 ulp of expf)

namespace fd_cpu {

// A Paddle error "<op>: <what>" unless ok.
inline void require(bool ok, const char* op, const std::string& what) {
  if (!ok) PD_THROW(std::string(op) + ": " + what);
}

// The lanes of a 16-lane vector that `remaining` elements fill.
inline __mmask16 lanes(int64_t remaining) {
  return static_cast<__mmask16>(remaining >= 16 ? 0xFFFF : (1u << remaining) - 1);
}

// 16 float32 values from p (masked past the end), a bfloat16 vector widened exactly.
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const uint16_t* p, __mmask16 m) {
  const __m256i bits = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// fn()'s outputs; its error as "<op> (<stage>): <the inner op's message>", which names the inner argument.
template <typename Fn>
std::vector<paddle::Tensor> stage(const char* op, const std::string& name, Fn fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    PD_THROW(op, " (", name, "): ", e.what());
  }
}

struct CacheLayer {
  int64_t nkv, hd, rows;   // KV heads, head size, blocks x block_size
};

// `cache` must be one float32 or bfloat16 CPU cache layer [blocks, block_size, 2, nkv, hd] (with the given hd
// unless hd < 0).
inline CacheLayer check_cache(const char* op, const paddle::Tensor& cache, int64_t hd = -1) {
  const auto& cs = cache.shape();
  require(cache.is_cpu() && cs.size() == 5 && cs[2] == 2 && cs[3] > 0 && (hd < 0 || cs[4] == hd) &&
              (cache.dtype() == paddle::DataType::FLOAT32 || cache.dtype() == paddle::DataType::BFLOAT16),
          op, "argument 'cache' must be a float32 or bfloat16 CPU tensor [blocks, block_size, 2, nkv, hd]");
  return {cs[3], cs[4], cs[0] * cs[1]};
}

// Every one of `count` cache rows lies in a cache of `cache_rows` (a bad one would read or write outside it; the
// message is built only for a bad one).
inline void check_rows(const char* op, const char* arg, const int64_t* rows, int64_t count, int64_t cache_rows) {
  for (int64_t i = 0; i < count; ++i)
    if (rows[i] < 0 || rows[i] >= cache_rows)
      require(false, op, "argument '" + std::string(arg) + "' holds row " + std::to_string(rows[i]) +
                             " of a cache of " + std::to_string(cache_rows));
}

}  // namespace fd_cpu
