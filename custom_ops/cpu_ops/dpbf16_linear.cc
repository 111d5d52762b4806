// The project's own CPU linear kernel (OPS §10.5; declarations and contract in dpbf16_linear.h).
//
// Layout: the N columns in blocks of 64; within a block, K in pairs (k0 = 2p, k1 = 2p + 1; an odd K gets a zero
// row); for each pair one "chunk" holding the block's 128 weights so that one vdpbf16ps per 16 columns multiplies
// them: 32-bit lane j of group g (g = 0..3) holds (W[k0][16g + j], W[k1][16g + j]).
//   bf16: chunk = 4 groups x 32 bf16 (256 bytes), group g at byte 64 g
//   int8: chunk = 2 halves of 64 bytes, groups 2h and 2h + 1 in half h, each value in sign-magnitude (bit 7 the
//         sign, bits 0-6 |q|); group 2h + s's 16-bit lane l at byte 64 h + 16 (l / 8) + 8 s + l % 8, so that
//         unpacking the half's bf16 low and high bytes (vpunpcklbw for s = 0, vpunpckhbw for s = 1) gives the lanes
//         in order. Two vpermt2b through 128-entry tables give the low and the high byte of bf16(|q|), then the
//         sign bit joins the high byte: five instructions per 64 weights where converting through int32 and
//         float32 takes ten (with the weights in cache a product took 1.5 x less time; from memory, 8 % less).
//   int4: chunk = 32 little-endian 16-bit words (64 bytes); nibble g of word l is group g's 16-bit lane l, a two's
//         complement value that one vpermw through a 16-entry table turns into bf16
//   f32:  no pairs: for each k one chunk of the block's 64 float32 weights (256 bytes), column order
// Blocks are contiguous (p-major), so a batch-1 product streams each block once, front to back.
//
// Every output element is one float32 chain acc = vdpbf16ps(acc, x pair p, W pair p) over p = 0, 1, ...,
// multiplied by its column's scale at the end for int8 / int4 (int8 and int4 values are exact in bf16, so the
// chain sums bf16(x) * Q exactly-rounded pair by pair). The chain is the same for every M and every tiling, so a row
// of out depends on its row of x alone.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")
// GCC 12's own intrinsics header trips this warning (its `__m512 __Y = __Y;` idiom for an undefined vector)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "dpbf16_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace fd_cpu {
namespace {

constexpr int64_t kCols = 64;   // columns per block: 4 groups of 16 float32 lanes
constexpr int kRows = 4;        // rows per register tile: 16 accumulators
constexpr int64_t kPrefetch = 2048;

int64_t chunk_bytes(int kind) { return kind == kBf16 || kind == kF32 ? 256 : kind == kInt8 ? 128 : 64; }
int64_t pairs(int64_t k) { return (k + 1) / 2; }
int64_t chunks(int64_t k, int kind) { return kind == kF32 ? k : pairs(k); }   // per block
int64_t blocks(int64_t n) { return (n + kCols - 1) / kCols; }

uint16_t bf16_bits(float f) {   // round to nearest, ties to even (weight_only.round_to_bf16)
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7FFF + ((b >> 16) & 1);
  return static_cast<uint16_t>(b >> 16);
}

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// The lookup tables of the integer kinds, built once.
struct Tables {
  __m512i int4;             // bf16 of the two's complement nibble u: 0..7 -> 0..7, 8..15 -> -8..-1 (16-bit entries)
  __m512i lo[2], hi[2];     // low and high byte of bf16(m), m = 0..127 (entries 0-63 in [0], 64-127 in [1])
  __m512i sign;             // 0x80 in every byte
};

Tables make_tables() {
  Tables t;
  alignas(64) uint16_t nibble[32] = {};
  for (int u = 0; u < 16; ++u) nibble[u] = bf16_bits(static_cast<float>(u < 8 ? u : u - 16));
  t.int4 = _mm512_load_si512(nibble);
  alignas(64) uint8_t lo[128], hi[128];
  for (int m = 0; m < 128; ++m) {
    const uint16_t b = bf16_bits(static_cast<float>(m));
    lo[m] = static_cast<uint8_t>(b & 0xFF);
    hi[m] = static_cast<uint8_t>(b >> 8);
  }
  for (int i = 0; i < 2; ++i) {
    t.lo[i] = _mm512_load_si512(lo + 64 * i);
    t.hi[i] = _mm512_load_si512(hi + 64 * i);
  }
  t.sign = _mm512_set1_epi8(static_cast<char>(0x80));
  return t;
}

// Byte of an int8 chunk that holds group g's 16-bit lane `lane` (the layout above).
int64_t int8_byte(int g, int64_t lane) { return 64 * (g / 2) + 16 * (lane / 8) + 8 * (g % 2) + lane % 8; }

// The 4 groups of one chunk as bf16 pairs.
template <int KIND>
inline void load_chunk(const uint8_t* c, const Tables& t, __m512i w[4]) {
  if constexpr (KIND == kBf16) {
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) w[g] = _mm512_loadu_si512(c + 64 * g);
  } else if constexpr (KIND == kInt8) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i v = _mm512_loadu_si512(c + 64 * h);
      const __m512i lo = _mm512_permutex2var_epi8(t.lo[0], v, t.lo[1]);   // index: bits 0-6, |q|
      const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t.hi[0], v, t.hi[1]), v, t.sign,
                                                   0xF8);                   // hi | (v & 0x80): the sign
      w[2 * h] = _mm512_unpacklo_epi8(lo, hi);
      w[2 * h + 1] = _mm512_unpackhi_epi8(lo, hi);
    }
  } else {
    const __m512i v = _mm512_loadu_si512(c), nib = _mm512_set1_epi16(0xF);
    w[0] = _mm512_permutexvar_epi16(_mm512_and_si512(v, nib), t.int4);
    w[1] = _mm512_permutexvar_epi16(_mm512_and_si512(_mm512_srli_epi16(v, 4), nib), t.int4);
    w[2] = _mm512_permutexvar_epi16(_mm512_and_si512(_mm512_srli_epi16(v, 8), nib), t.int4);
    w[3] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 12), t.int4);
  }
}

// acc[R][4] over one block: xb holds R rows of bf16 x (row stride ldx uint16), kp pairs. The accumulators are
// locals and the small loops unrolled, so they stay in registers: GCC otherwise keeps them in memory, a store-load
// round trip every pair.
template <int KIND, int R>
inline void tile(const uint16_t* xb, int64_t ldx, int64_t kp, const uint8_t* block, const Tables& tables,
                 __m512 acc[kRows][4]) {
  __m512 a[R][4];
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) a[r][g] = _mm512_setzero_ps();
  constexpr int64_t chunk = KIND == kBf16 ? 256 : KIND == kInt8 ? 128 : 64;
  for (int64_t p = 0; p < kp; ++p) {
    // the hardware's prefetchers stop at each 4 KiB page: ask for the lines kPrefetch bytes ahead
#pragma GCC unroll 4
    for (int64_t line = 0; line < chunk; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(block + p * chunk + kPrefetch + line), _MM_HINT_T0);
    __m512i w[4];
    load_chunk<KIND>(block + p * chunk, tables, w);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, xb + r * ldx + 2 * p, 4);
      const __m512bh x = as_bh(_mm512_set1_epi32(pair));
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) a[r][g] = _mm512_dpbf16_ps(a[r][g], x, as_bh(w[g]));
    }
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) acc[r][g] = a[r][g];
}

template <int KIND>
void tile_rows(int rows, const uint16_t* xb, int64_t ldx, int64_t kp, const uint8_t* block, const Tables& tables,
               __m512 acc[kRows][4]) {
  switch (rows) {
    case 1: tile<KIND, 1>(xb, ldx, kp, block, tables, acc); break;
    case 2: tile<KIND, 2>(xb, ldx, kp, block, tables, acc); break;
    case 3: tile<KIND, 3>(xb, ldx, kp, block, tables, acc); break;
    default: tile<KIND, 4>(xb, ldx, kp, block, tables, acc); break;
  }
}

// One block of 64 columns for all M rows. With more than one row tile, integer weights are widened to bf16 once
// into `panel` and every tile reads that: the same bf16 values, so the same chains as the widening on the fly.
template <int KIND>
void run_block(const uint16_t* xb, int64_t m, int64_t ldx, int64_t kp, const uint8_t* block, const float* scales,
               int64_t col0, int64_t n, float* out, std::vector<uint16_t>& panel) {
  static const Tables tables = make_tables();   // built once, not per block
  const uint8_t* weights = block;
  bool widened = false;
  if (KIND != kBf16 && m > kRows) {
    panel.resize(static_cast<size_t>(kp * 128));
    for (int64_t p = 0; p < kp; ++p) {
      __m512i w[4];
      load_chunk<KIND>(block + p * chunk_bytes(KIND), tables, w);
      for (int g = 0; g < 4; ++g) _mm512_storeu_si512(panel.data() + p * 128 + 32 * g, w[g]);
    }
    weights = reinterpret_cast<const uint8_t*>(panel.data());
    widened = true;
  }
  const int64_t valid = std::min(kCols, n - col0);
  __mmask16 mask[4];
  __m512 scale[4];
  for (int g = 0; g < 4; ++g) {
    const int64_t v = std::clamp<int64_t>(valid - 16 * g, 0, 16);
    mask[g] = static_cast<__mmask16>((1u << v) - 1);
    scale[g] = KIND == kBf16 ? _mm512_set1_ps(1.0f) : _mm512_maskz_loadu_ps(mask[g], scales + col0 + 16 * g);
  }
  __m512 acc[kRows][4];
  for (int64_t r0 = 0; r0 < m; r0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
    if (widened)
      tile_rows<kBf16>(rows, xb + r0 * ldx, ldx, kp, weights, tables, acc);
    else
      tile_rows<KIND>(rows, xb + r0 * ldx, ldx, kp, weights, tables, acc);
    for (int r = 0; r < rows; ++r)
      for (int g = 0; g < 4; ++g) {
        const __m512 y = KIND == kBf16 ? acc[r][g] : _mm512_mul_ps(acc[r][g], scale[g]);
        _mm512_mask_storeu_ps(out + (r0 + r) * n + col0 + 16 * g, mask[g], y);
      }
  }
}

// x [M, K] float32 -> bf16 rows of 2 * kp elements (round to nearest even; an odd K's pad element 0).
void round_rows(const float* x, int64_t m, int64_t k, int64_t ldx, uint16_t* xb) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < ldx; i += 16) {
      const int64_t v = std::clamp<int64_t>(k - i, 0, 16), w = std::min<int64_t>(16, ldx - i);
      const __m512 f = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << v) - 1), x + r * k + i);
      const __m256i b = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(f));
      _mm256_mask_storeu_epi16(xb + r * ldx + i, static_cast<__mmask16>((1u << w) - 1), b);
    }
}

// float32 weights: acc[R][4] over one block, one FMA per k and column, x read as is.
template <int R>
inline void tile_f32(const float* x, int64_t k, const float* block, __m512 acc[kRows][4]) {
  __m512 a[R][4];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) a[r][g] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
#pragma GCC unroll 4
    for (int64_t line = 0; line < 4; ++line)
      _mm_prefetch(reinterpret_cast<const char*>(block + i * kCols) + kPrefetch + 64 * line, _MM_HINT_T0);
    __m512 w[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) w[g] = _mm512_loadu_ps(block + i * kCols + 16 * g);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 xr = _mm512_set1_ps(x[r * k + i]);
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) a[r][g] = _mm512_fmadd_ps(xr, w[g], a[r][g]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) acc[r][g] = a[r][g];
}

void run_block_f32(const float* x, int64_t m, int64_t k, const float* block, int64_t col0, int64_t n, float* out) {
  const int64_t valid = std::min(kCols, n - col0);
  __m512 acc[kRows][4];
  for (int64_t r0 = 0; r0 < m; r0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
    const float* xr = x + r0 * k;
    switch (rows) {
      case 1: tile_f32<1>(xr, k, block, acc); break;
      case 2: tile_f32<2>(xr, k, block, acc); break;
      case 3: tile_f32<3>(xr, k, block, acc); break;
      default: tile_f32<4>(xr, k, block, acc); break;
    }
    for (int r = 0; r < rows; ++r)
      for (int g = 0; g < 4; ++g) {
        const int64_t v = std::clamp<int64_t>(valid - 16 * g, 0, 16);
        _mm512_mask_storeu_ps(out + (r0 + r) * n + col0 + 16 * g, static_cast<__mmask16>((1u << v) - 1), acc[r][g]);
      }
  }
}

void run_f32(const float* x, int64_t m, int64_t k, int64_t n, const uint8_t* packed, float* out) {
  const int64_t nb = blocks(n);
  const float* weights = reinterpret_cast<const float*>(packed);
#pragma omp parallel for schedule(static) if (nb > 1 && m * k * n >= (1 << 20))
  for (int64_t b = 0; b < nb; ++b) run_block_f32(x, m, k, weights + b * k * kCols, b * kCols, n, out);
}

template <int KIND>
void run(const float* x, int64_t m, int64_t k, int64_t n, const uint8_t* packed, const float* scales, float* out) {
  const int64_t kp = pairs(k), ldx = 2 * kp, nb = blocks(n), block = kp * chunk_bytes(KIND);
  std::vector<uint16_t> xb(static_cast<size_t>(m * ldx));
  round_rows(x, m, k, ldx, xb.data());
  // Blocks are independent, so threads split them without changing any element's chain.
#pragma omp parallel if (nb > 1 && m * k * n >= (1 << 20))
  {
    std::vector<uint16_t> panel;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nb; ++b)
      run_block<KIND>(xb.data(), m, ldx, kp, packed + b * block, scales, b * kCols, n, out, panel);
  }
}

}  // namespace

bool has_dpbf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
         __builtin_cpu_supports("avx512vbmi");
}

size_t dpbf16_packed_bytes(int64_t k, int64_t n, int kind) {
  return static_cast<size_t>(blocks(n) * chunks(k, kind) * chunk_bytes(kind));
}

void dpbf16_pack(const void* w, int64_t k, int64_t n, int kind, uint8_t* packed) {
  const int64_t kp = pairs(k), chunk = chunk_bytes(kind), block = kp * chunk;
  std::memset(packed, 0, dpbf16_packed_bytes(k, n, kind));
  const float* wf = static_cast<const float*>(w);
  const int8_t* wq = static_cast<const int8_t*>(w);
  if (kind == kF32) {
    float* dst = reinterpret_cast<float*>(packed);
    for (int64_t row = 0; row < k; ++row)
      for (int64_t col = 0; col < n; ++col) dst[(col / kCols) * k * kCols + row * kCols + col % kCols] = wf[row * n + col];
    return;
  }
  for (int64_t row = 0; row < k; ++row)
    for (int64_t col = 0; col < n; ++col) {
      const int64_t p = row / 2, h = row % 2, c = col % kCols, g = c / 16, j = c % 16;
      uint8_t* ch = packed + (col / kCols) * block + p * chunk;
      const int64_t lane = 2 * j + h;   // 16-bit lane of group g
      if (kind == kBf16) {
        const uint16_t v = bf16_bits(wf[row * n + col]);
        std::memcpy(ch + 2 * (32 * g + lane), &v, 2);
      } else if (kind == kInt8) {   // |q| <= 127 (the op checks)
        const int q = wq[row * n + col];
        ch[int8_byte(static_cast<int>(g), lane)] = static_cast<uint8_t>(q < 0 ? 0x80 | -q : q);
      } else {   // nibble g of word `lane`: byte 2 lane + g / 2, high nibble for odd g
        ch[2 * lane + g / 2] |= static_cast<uint8_t>((wq[row * n + col] & 0xF) << (4 * (g % 2)));
      }
    }
}

void dpbf16_linear(const float* x, int64_t m, int64_t k, int64_t n, int kind, const uint8_t* packed,
                   const float* scales, float* out) {
  if (m == 0 || n == 0) return;
  switch (kind) {
    case kF32: run_f32(x, m, k, n, packed, out); break;
    case kBf16: run<kBf16>(x, m, k, n, packed, scales, out); break;
    case kInt8: run<kInt8>(x, m, k, n, packed, scales, out); break;
    default: run<kInt4>(x, m, k, n, packed, scales, out); break;
  }
}

void dpbf16_columns(const uint8_t* packed, int64_t k, int64_t n, int kind, const int64_t* ids, int64_t count,
                    float* out) {
  const int64_t kp = pairs(k);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = ids[i], b = j / kCols, c = j % kCols, g = c / 16, lane = c % 16;
    float* row = out + i * k;
    if (kind == kF32) {
      const float* col = reinterpret_cast<const float*>(packed) + b * k * kCols + c;
      for (int64_t r = 0; r < k; ++r) row[r] = col[r * kCols];
    } else {   // kBf16: W[r][j] is 16-bit lane 2 lane + r % 2 of group g in pair r / 2's chunk
      const uint8_t* block = packed + b * kp * 256;
      for (int64_t r = 0; r < k; ++r) {
        uint16_t bits;
        std::memcpy(&bits, block + (r / 2) * 256 + 2 * (32 * g + 2 * lane + r % 2), 2);
        const uint32_t wide = static_cast<uint32_t>(bits) << 16;
        std::memcpy(row + r, &wide, 4);
      }
    }
  }
}

}  // namespace fd_cpu
