// The project's own CPU linear kernel (OPS §10.5): y = bf16(x) @ W (x scale), with W stored as bf16, int8 or int4
// in a layout made for AVX512_BF16's pair dot product (vdpbf16ps), and y = x @ W for float32 weights (FMA). Used
// where oneDNN and MKL measurably do not reach memory speed (benchmarks/cpu_linear.py); needs avx512f, avx512bw,
// avx512vl, avx512_bf16 and avx512vbmi (has_dpbf16()).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fd_cpu {

// Weight element kinds, as the ops' `kind` attribute spells them.
enum Kind : int { kBf16 = 0, kInt8 = 1, kInt4 = 2, kF32 = 3 };

bool has_dpbf16();

// Bytes of the packed form of a [K, N] weight of `kind`.
size_t dpbf16_packed_bytes(int64_t k, int64_t n, int kind);

// Packs w [K, N] (float32 for kBf16, rounded to nearest even, and for kF32; int8 values for kInt8, and in
// [-8, 7] for kInt4).
void dpbf16_pack(const void* w, int64_t k, int64_t n, int kind, uint8_t* packed);

// out [M, N] = bf16(x [M, K]) @ W, times scales[n] (N floats) for kInt8 and kInt4; x @ W for kF32. Each element
// is one chain (vdpbf16ps over ascending pairs of K; for kF32 one FMA per k) whatever M is, so a row's result does
// not depend on the other rows.
void dpbf16_linear(const float* x, int64_t m, int64_t k, int64_t n, int kind, const uint8_t* packed,
                   const float* scales, float* out);

// out [len(ids), K] float32: columns ids of a packed kBf16 or kF32 weight W [K, N] (a tied LM head read as the
// embedding table: row j of the table is column j of the head).
void dpbf16_columns(const uint8_t* packed, int64_t k, int64_t n, int kind, const int64_t* ids, int64_t count,
                    float* out);

}  // namespace fd_cpu
