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
//         complement value that one vpermw through a 16-entry table (held twice) turns into bf16
//   f32:  no pairs: for each k one chunk of the block's 64 float32 weights (256 bytes), column order
// Blocks are contiguous (p-major), so a batch-1 product streams each block once, front to back.
//
// Every output element is one float32 chain acc = vdpbf16ps(acc, x pair p, W pair p) over p = 0, 1, ...,
// multiplied by its column's scale at the end for int8 / int4 (int8 and int4 values are exact in bf16, so the
// chain sums bf16(x) * Q exactly-rounded pair by pair). The chain is the same for every M and every tiling, so a row
// of out depends on its row of x alone. Products of several row tiles may take the FMA route (below): the same
// chain as two FMAs.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")
// GCC 12's own intrinsics header trips this warning (its `__m512 __Y = __Y;` idiom for an undefined vector)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "dpbf16_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <climits>
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
  __m512i int4;             // bf16 of the two's complement nibble u: 0..7 -> 0..7, 8..15 -> -8..-1 (16-bit entries),
                            // twice: vpermw reads 5 index bits, so entry i is nibble i & 15's (the next nibble's low
                            // bit, above the index's four, picks a copy and needs no mask)
  __m512i lo[2], hi[2];     // low and high byte of bf16(m), m = 0..127 (entries 0-63 in [0], 64-127 in [1])
  __m512i sign;             // 0x80 in every byte
};

Tables make_tables() {
  Tables t;
  alignas(64) uint16_t nibble[32] = {};
  for (int i = 0; i < 32; ++i) nibble[i] = bf16_bits(static_cast<float>((i & 15) < 8 ? (i & 15) : (i & 15) - 16));
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
    const __m512i v = _mm512_loadu_si512(c);   // index bits 0-4 of each word (the table's two copies)
    w[0] = _mm512_permutexvar_epi16(v, t.int4);
    w[1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), t.int4);
    w[2] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 8), t.int4);
    w[3] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 12), t.int4);
  }
}

// acc ([R rows][4 groups][16]) += the products of kp pairs of one block: xb holds R rows of bf16 x (row stride ldx
// uint16). The accumulators are locals and the small loops unrolled, so they stay in registers: GCC otherwise keeps
// them in memory, a store-load round trip every pair.
template <int KIND, int R>
inline void tile(const uint16_t* xb, int64_t ldx, int64_t kp, const uint8_t* block, const Tables& tables,
                 float* acc) {
  __m512 a[R][4];
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) a[r][g] = _mm512_loadu_ps(acc + 16 * (4 * r + g));
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
    for (int g = 0; g < 4; ++g) _mm512_storeu_ps(acc + 16 * (4 * r + g), a[r][g]);
}

template <int KIND>
void tile_rows(int rows, const uint16_t* xb, int64_t ldx, int64_t kp, const uint8_t* block, const Tables& tables,
               float* acc) {
  switch (rows) {
    case 1: tile<KIND, 1>(xb, ldx, kp, block, tables, acc); break;
    case 2: tile<KIND, 2>(xb, ldx, kp, block, tables, acc); break;
    case 3: tile<KIND, 3>(xb, ldx, kp, block, tables, acc); break;
    default: tile<KIND, 4>(xb, ldx, kp, block, tables, acc); break;
  }
}

// The accumulators of one row tile, [row][group][16 lanes] (plain floats: a std::vector of __m512 is not
// necessarily 64-byte aligned here).
struct Acc {
  float v[kRows * 4 * 16];
};

// Every row tile of one block over `steps` steps of K (pairs, or rows of float32 weights), as
// tile_fn(rows, r0, s0, sn, acc) adds steps s0 .. s0 + sn - 1 of rows r0 .. r0 + rows - 1 to acc, after
// begin_slice(s0, sn). With one tile it streams the block once; with several, K goes in slices of kSliceBytes that
// stay in L1 while each tile reads them (otherwise every tile re-reads the whole block from L2). A slice's partial
// sums wait in `accs` as float32, so each element's chain is the one pass's, bit for bit.
constexpr int64_t kSliceBytes = 16 << 10;

template <typename TileFn, typename SliceFn>
void tiles_in_slices(int64_t m, int64_t steps, int64_t step_bytes, std::vector<Acc>& accs, TileFn tile_fn,
                     SliceFn begin_slice) {
  const int64_t tiles = (m + kRows - 1) / kRows;
  const int64_t slice = tiles == 1 ? steps : std::max<int64_t>(1, kSliceBytes / step_bytes);
  accs.resize(static_cast<size_t>(tiles));
  for (Acc& a : accs) std::fill(std::begin(a.v), std::end(a.v), 0.0f);
  for (int64_t s0 = 0; s0 < steps; s0 += slice) {
    const int64_t sn = std::min(slice, steps - s0);
    begin_slice(s0, sn);
    for (int64_t t = 0; t < tiles; ++t)
      tile_fn(static_cast<int>(std::min<int64_t>(kRows, m - t * kRows)), t * kRows, s0, sn,
              accs[static_cast<size_t>(t)].v);
  }
}

// out rows [M, 64 columns of the block from col0] = the accumulators (times scale for the integer kinds).
void store_rows(const std::vector<Acc>& accs, int64_t m, int64_t col0, int64_t n, const float* scales, float* out) {
  const int64_t valid = std::min(kCols, n - col0);
  for (int g = 0; g < 4; ++g) {
    const __mmask16 mask = static_cast<__mmask16>((1u << std::clamp<int64_t>(valid - 16 * g, 0, 16)) - 1);
    const __m512 scale = scales ? _mm512_maskz_loadu_ps(mask, scales + col0 + 16 * g) : _mm512_set1_ps(1.0f);
    for (int64_t r = 0; r < m; ++r) {
      const __m512 sum = _mm512_loadu_ps(accs[static_cast<size_t>(r / kRows)].v + 16 * (4 * (r % kRows) + g));
      _mm512_mask_storeu_ps(out + r * n + col0 + 16 * g, mask, scales ? _mm512_mul_ps(sum, scale) : sum);
    }
  }
}

// float32 weights: acc ([R][4][16]) += the products of kn rows of a block of 64 columns (x's row stride ldx), one
// FMA per row and column, x read as is. Row i also prefetches PF lines from pf + i pf_step: the hardware's
// prefetchers stop at each 4 KiB page, and a burst of prefetches stalls on the line fill buffers.
template <int R, int PF>
inline void tile_f32(const float* x, int64_t ldx, int64_t kn, const float* block, float* acc, const char* pf,
                     int64_t pf_step) {
  __m512 a[R][4];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) a[r][g] = _mm512_loadu_ps(acc + 16 * (4 * r + g));
  for (int64_t i = 0; i < kn; ++i) {
#pragma GCC unroll 4
    for (int line = 0; line < PF; ++line) _mm_prefetch(pf + i * pf_step + 64 * line, _MM_HINT_T0);
    __m512 w[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) w[g] = _mm512_loadu_ps(block + i * kCols + 16 * g);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 xr = _mm512_set1_ps(x[r * ldx + i]);
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) a[r][g] = _mm512_fmadd_ps(xr, w[g], a[r][g]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) _mm512_storeu_ps(acc + 16 * (4 * r + g), a[r][g]);
}

template <int PF>
void tile_f32_rows(int rows, const float* x, int64_t ldx, int64_t kn, const float* block, float* acc, const char* pf,
                   int64_t pf_step) {
  switch (rows) {
    case 1: tile_f32<1, PF>(x, ldx, kn, block, acc, pf, pf_step); break;
    case 2: tile_f32<2, PF>(x, ldx, kn, block, acc, pf, pf_step); break;
    case 3: tile_f32<3, PF>(x, ldx, kn, block, acc, pf, pf_step); break;
    default: tile_f32<4, PF>(x, ldx, kn, block, acc, pf, pf_step); break;
  }
}

// ---- The FMA route: a pair's vdpbf16ps as two float32 FMAs ----
//
// Intel defines vdpbf16ps as acc += x[2p+1] w[2p+1], rounded, then acc += x[2p] w[2p], rounded (denormals read as
// and flushed to zero): a bf16 product is exact in float32, so that is two FMAs, odd element first. Where a CPU
// runs vdpbf16ps at half the FMA's rate per multiply (an Intel Xeon with AMX here: 59 against 117 G multiply-adds
// a second), a product of several row tiles is faster with the weights widened to float32 and FMAs: the same chain,
// bit for bit, where probe_fma_route() finds it so (denormals-are-zero and flush-to-zero set around its sums). A
// batch-1 product stays on vdpbf16ps: it is bound by reading the weights, and bf16 reads half the bytes.

// One pair of a block widened: two float32 rows of the block's 64 columns.
constexpr int64_t kWidePairBytes = 2 * kCols * 4;
constexpr int64_t kSlicePairs = kSliceBytes / kWidePairBytes;   // pairs of a route slice

// Pairs p0 .. p0 + sn - 1 of a block as float32 rows in the route's order: row 2 (p - p0) the odd element of pair
// p (the high half of each 32-bit lane), row 2 (p - p0) + 1 the even one.
template <int KIND>
void widen_pairs(const uint8_t* block, int64_t p0, int64_t sn, const Tables& tables, float* panel) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t p = 0; p < sn; ++p) {
    __m512i w[4];
    load_chunk<KIND>(block + (p0 + p) * chunk_bytes(KIND), tables, w);
    float* odd = panel + 2 * p * kCols;
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      _mm512_storeu_si512(odd + 16 * g, _mm512_and_si512(w[g], high));
      _mm512_storeu_si512(odd + kCols + 16 * g, _mm512_slli_epi32(w[g], 16));
    }
  }
}

// bf16 rows [M, ldx] -> float32 rows with each pair's two elements swapped (odd first), as the route reads x.
void swapped_pairs(const uint16_t* xb, int64_t m, int64_t ldx, float* xf) {
  for (int64_t i = 0; i < m * ldx; i += 2) {
    const uint32_t even = static_cast<uint32_t>(xb[i]) << 16, odd = static_cast<uint32_t>(xb[i + 1]) << 16;
    std::memcpy(xf + i, &odd, 4);
    std::memcpy(xf + i + 1, &even, 4);
  }
}

// Sets denormals-are-zero and flush-to-zero for this thread's SSE / AVX arithmetic while it lives.
class DenormalsAsZero {
 public:
  DenormalsAsZero() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }
  ~DenormalsAsZero() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
};

// Whether the route equals vdpbf16ps bit for bit on this CPU (values of every magnitude, cancellations, zeros,
// denormal x) and runs a 16-row slice faster (each timed over the same L1-resident slice, best of 5).
bool probe_fma_route() {
  static const Tables tables = make_tables();
  constexpr int64_t kp = kSlicePairs, m = 16, ldx = 2 * kp;   // one slice: no slicing in either path
  std::vector<uint8_t> block(kp * 256);
  std::vector<uint16_t> xb(m * ldx);
  uint32_t state = 12345;
  auto next = [&state] { return state = state * 1664525u + 1013904223u; };
  auto random_bf16 = [&next] {   // sign, exponent 2^-40 .. 2^40 (and an occasional denormal), mantissa
    const uint32_t r = next();
    const uint32_t exponent = r % 97 == 0 ? 0 : 87 + (r >> 8) % 81;
    return static_cast<uint16_t>(((r >> 31) << 15) | (exponent << 7) | ((r >> 16) & 0x7F));
  };
  for (size_t i = 0; i < block.size(); i += 2) {
    const uint16_t v = next() % 11 == 0 ? 0 : random_bf16();
    std::memcpy(block.data() + i, &v, 2);
  }
  for (uint16_t& v : xb) v = random_bf16();
  std::vector<float> xf(m * ldx), panel(2 * kp * kCols);
  swapped_pairs(xb.data(), m, ldx, xf.data());
  std::vector<Acc> direct, route;
  auto run_direct = [&] {
    tiles_in_slices(m, kp, 256, direct, [&](int rows, int64_t r0, int64_t, int64_t sn, float* acc) {
      tile_rows<kBf16>(rows, xb.data() + r0 * ldx, ldx, sn, block.data(), tables, acc);
    }, [](int64_t, int64_t) {});
  };
  auto run_route = [&] {
    DenormalsAsZero daz;
    widen_pairs<kBf16>(block.data(), 0, kp, tables, panel.data());
    tiles_in_slices(m, kp, kWidePairBytes, route, [&](int rows, int64_t r0, int64_t, int64_t sn, float* acc) {
      tile_f32_rows<1>(rows, xf.data() + r0 * ldx, ldx, 2 * sn, panel.data(), acc,
                       reinterpret_cast<const char*>(panel.data()), 0);
    }, [](int64_t, int64_t) {});
  };
  run_direct();
  run_route();
  for (int64_t t = 0; t < m / kRows; ++t)
    if (std::memcmp(direct[t].v, route[t].v, sizeof(Acc::v)) != 0) return false;
  auto best_ns = [](auto&& fn) {
    int64_t best = INT64_MAX;
    for (int round = 0; round < 5; ++round) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int rep = 0; rep < 50; ++rep) fn();
      const auto t1 = std::chrono::steady_clock::now();
      best = std::min<int64_t>(best, std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    }
    return best;
  };
  return best_ns(run_route) < best_ns(run_direct);
}

bool fma_route() {
  static const bool chosen = probe_fma_route();
  return chosen;
}

// One block of 64 columns for all M rows. With more than one row tile: the FMA route where fma_route(), else
// integer weights are widened to bf16 once into `panel` and every tile reads that (the same bf16 values, so the
// same chains as the widening on the fly).
template <int KIND>
void run_block(const uint16_t* xb, const float* xf, int64_t m, int64_t ldx, int64_t kp, const uint8_t* block,
               const float* scales, int64_t col0, int64_t n, float* out, std::vector<uint16_t>& panel,
               std::vector<float>& fpanel, std::vector<Acc>& accs) {
  static const Tables tables = make_tables();   // built once, not per block
  const float* scale = KIND == kBf16 ? nullptr : scales;
  if (xf) {
    fpanel.resize(static_cast<size_t>(kSlicePairs * 2 * kCols));
    {
      DenormalsAsZero daz;   // the sums only: the scale multiplies as on the direct path
      // While the tiles multiply one slice, they prefetch the next slice's packed weights (after the last slice,
      // the next block's first, which follows it in memory), each tile its share.
      const int64_t tiles = (m + kRows - 1) / kRows, share = kSlicePairs * chunk_bytes(KIND) / tiles;
      tiles_in_slices(m, kp, kWidePairBytes, accs, [&](int rows, int64_t r0, int64_t s0, int64_t sn, float* acc) {
        const char* next = reinterpret_cast<const char*>(block + (s0 + sn) * chunk_bytes(KIND));
        tile_f32_rows<1>(rows, xf + r0 * ldx + 2 * s0, ldx, 2 * sn, fpanel.data(), acc, next + r0 / kRows * share,
                         std::max<int64_t>(1, share / (2 * sn)));
      }, [&](int64_t s0, int64_t sn) { widen_pairs<KIND>(block, s0, sn, tables, fpanel.data()); });
    }
    store_rows(accs, m, col0, n, scale, out);
    return;
  }
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
  const int64_t step_bytes = widened ? chunk_bytes(kBf16) : chunk_bytes(KIND);
  tiles_in_slices(m, kp, step_bytes, accs, [&](int rows, int64_t r0, int64_t s0, int64_t sn, float* acc) {
    const uint16_t* xs = xb + r0 * ldx + 2 * s0;
    if (widened)
      tile_rows<kBf16>(rows, xs, ldx, sn, weights + s0 * step_bytes, tables, acc);
    else
      tile_rows<KIND>(rows, xs, ldx, sn, weights + s0 * step_bytes, tables, acc);
  }, [](int64_t, int64_t) {});
  store_rows(accs, m, col0, n, scale, out);
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

void run_f32(const float* x, int64_t m, int64_t k, int64_t n, const uint8_t* packed, float* out) {
  const int64_t nb = blocks(n), tiles = (m + kRows - 1) / kRows, share = kSliceBytes / tiles;
  const float* weights = reinterpret_cast<const float*>(packed);
#pragma omp parallel if (nb > 1 && m * k * n >= (1 << 20))
  {
    std::vector<Acc> accs;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nb; ++b) {
      const float* block = weights + b * k * kCols;
      tiles_in_slices(m, k, kCols * 4, accs, [&](int rows, int64_t r0, int64_t s0, int64_t sn, float* acc) {
        const float* weights = block + s0 * kCols;
        if (tiles == 1) {   // one pass over the block: stream it kPrefetch bytes ahead
          tile_f32_rows<4>(rows, x + r0 * k + s0, k, sn, weights, acc,
                           reinterpret_cast<const char*>(weights) + kPrefetch, kCols * 4);
        } else {   // slices: the next one (after the last, the next block's first) prefetched, each tile its share
          const char* next = reinterpret_cast<const char*>(block + (s0 + sn) * kCols);
          tile_f32_rows<1>(rows, x + r0 * k + s0, k, sn, weights, acc, next + r0 / kRows * share,
                           std::max<int64_t>(1, share / sn));
        }
      }, [](int64_t, int64_t) {});
      store_rows(accs, m, b * kCols, n, nullptr, out);
    }
  }
}

template <int KIND>
void run(const float* x, int64_t m, int64_t k, int64_t n, const uint8_t* packed, const float* scales, float* out) {
  const int64_t kp = pairs(k), ldx = 2 * kp, nb = blocks(n), block = kp * chunk_bytes(KIND);
  std::vector<uint16_t> xb(static_cast<size_t>(m * ldx));
  round_rows(x, m, k, ldx, xb.data());
  std::vector<float> xf;
  if (m > kRows && fma_route()) {
    xf.resize(xb.size());
    swapped_pairs(xb.data(), m, ldx, xf.data());
  }
  // Blocks are independent, so threads split them without changing any element's chain.
#pragma omp parallel if (nb > 1 && m * k * n >= (1 << 20))
  {
    std::vector<uint16_t> panel;
    std::vector<float> fpanel;
    std::vector<Acc> accs;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nb; ++b)
      run_block<KIND>(xb.data(), xf.empty() ? nullptr : xf.data(), m, ldx, kp, packed + b * block, scales,
                      b * kCols, n, out, panel, fpanel, accs);
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
