// Reduced-precision linear layers on the CPU (OPS §10), Paddle custom ops with two kernels:
//
//   fd_cpu_pack_weight(w [K, N] float32 | int8, kind, kernel)                     -> packed uint8 [bytes]
//   fd_cpu_linear(x [M, K] float32, packed, scales [N] float32, k, n, kind, kernel) -> out [M, N] float32
//   fd_cpu_packed_columns(packed, ids [L] int64, k, n, kind, kernel)                -> out [L, K] float32
//
// kind 0: bf16 weights; 1: int8 weights (WINT8), 2: int4 weights (WINT4), each with one float32 scale per output
// channel; 3: float32 weights (kernel 1 only: elsewhere Paddle's own matmul). kernel 1 is the project's own AVX512_BF16 kernel (dpbf16_linear.cc), kernel 0 oneDNN's matmul over the
// libdnnl.so.3 that Paddle's own wheel ships and has already loaded (there is never a second oneDNN in the
// process); for integer weights oneDNN's "weights decompression" applies the scales. For oneDNN, x is rounded to
// bf16 first: oneDNN's fast kernels need bf16 activations (with float32 ones it falls back to its reference
// implementation, ~100 x slower; PRECISION-FACTS). bf16 and int8 weights are packed once into the blocked layout
// oneDNN chooses for M = 1, which it accepts for every M (checked for M up to 2048); int4 stays in the plain
// [K, N] layout, two values a byte (oneDNN refuses to reorder int4 into its own layout), N padded to even.
// Primitives are created once per (M, K, N, kind) and cached.
#include <dnnl.hpp>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "dpbf16_linear.h"
#include "paddle/extension.h"

namespace {

using fd_cpu::kBf16;
using fd_cpu::kF32;
using fd_cpu::kInt4;
using fd_cpu::kInt8;

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

enum Kernel : int { kOneDnn = 0, kDpbf16 = 1 };

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& cpu_stream() {
  thread_local dnnl::stream s(cpu_engine());
  return s;
}

dt weight_type(int kind) {
  switch (kind) {
    case kBf16: return dt::bf16;
    case kInt8: return dt::s8;
    case kInt4: return dt::s4;
  }
  PD_THROW("fd_cpu_linear: argument 'kind' must be 0 (bf16), 1 (int8) or 2 (int4), got ", kind);
}

void require(bool ok, const std::string& what) {
  if (!ok) PD_THROW(what);
}

// N as stored: int4 packs two values of a row of [K, N] into a byte, so an odd N gets one zero column.
int64_t stored_n(int64_t n, int kind) { return kind == kInt4 ? n + (n & 1) : n; }

dnnl::matmul::primitive_desc matmul_desc(int64_t m, int64_t k, int64_t n, int kind, const memory::desc& weights) {
  dnnl::primitive_attr attr;
  if (kind != kBf16) {
    attr.set_scales(DNNL_ARG_WEIGHTS, 1 << 1, {}, dt::f32);    // one scale per output channel (N)
    attr.set_fpmath_mode(dnnl::fpmath_mode::bf16, true);       // integer weights decompressed to bf16
  }
  return dnnl::matmul::primitive_desc(cpu_engine(), memory::desc({m, k}, dt::bf16, tag::ab), weights,
                                      memory::desc({m, stored_n(n, kind)}, dt::f32, tag::ab), attr);
}

// The weights' memory layout, the same for every M (int4: plain [K, N']).
memory::desc weights_desc(int64_t k, int64_t n, int kind) {
  if (kind == kInt4) return memory::desc({k, stored_n(n, kind)}, dt::s4, tag::ab);
  return matmul_desc(1, k, n, kind, memory::desc({k, n}, weight_type(kind), tag::any)).weights_desc();
}

struct Step {
  memory::desc weights;
  dnnl::matmul matmul;
  dnnl::reorder to_bf16;   // x [M, K] float32 -> bf16
};

const Step& step_for(int64_t m, int64_t k, int64_t n, int kind) {
  static std::mutex lock;
  static std::map<std::tuple<int64_t, int64_t, int64_t, int>, Step> cache;
  std::lock_guard<std::mutex> hold(lock);
  auto key = std::make_tuple(m, k, n, kind);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  memory::desc w = weights_desc(k, n, kind);
  auto pd = matmul_desc(m, k, n, kind, w);
  // Every M runs the implementation M = 1 runs, so that a row's sum does not depend on M (OPS §10.3): on a CPU with
  // AMX oneDNN prefers its AMX brgemm from M = 2, whose blocking sums in another order than the AVX-512 one.
  const std::string single = matmul_desc(1, k, n, kind, w).impl_info_str();
  while (single != pd.impl_info_str())
    require(pd.next_impl(), "fd_cpu_linear: oneDNN offers no implementation '" + single + "' for M = " +
                                std::to_string(m) + " (the one M = 1 runs; rows would depend on M)");
  memory::desc x32({m, k}, dt::f32, tag::ab), x16({m, k}, dt::bf16, tag::ab);
  dnnl::reorder::primitive_desc rd(cpu_engine(), x32, cpu_engine(), x16);
  return cache.emplace(key, Step{w, dnnl::matmul(pd), dnnl::reorder(rd)}).first->second;
}

// kind in 0..3 (3, float32 weights, for kernel 1 only) and a kernel this CPU runs
void check_kind_kernel(const char* op, int kind, int kernel) {
  require(kernel == kOneDnn || kernel == kDpbf16,
          std::string(op) + ": argument 'kernel' must be 0 (oneDNN) or 1 (AVX512_BF16), got " + std::to_string(kernel));
  static const bool dpbf16 = fd_cpu::has_dpbf16();
  require(kernel != kDpbf16 || dpbf16,
          std::string(op) + ": argument 'kernel' is 1 (AVX512_BF16) but this CPU lacks avx512f/bw/vl/avx512_bf16");
  require(kind >= kBf16 && kind <= kF32 && (kind != kF32 || kernel == kDpbf16),
          std::string(op) + ": argument 'kind' must be 0 (bf16), 1 (int8), 2 (int4) or, with kernel 1, 3 (float32); "
          "got " + std::to_string(kind) + " with kernel " + std::to_string(kernel));
}

}  // namespace

// ---- fd_cpu_pack_weight ----

// Packed weights live in arenas of their own: anonymous mappings, 2 MiB-aligned, marked for transparent huge pages
// before any byte of them is written (Linux's THP mode on this machine kind is "madvise": unmarked, every 4 KiB page
// of a weight stream costs its own TLB miss, and a batch-1 product streams each weight once; docs/benchmarks.md
// "Huge pages"). A buffer from Paddle's allocator came from malloc's heap as often as not, pages already touched by
// the load's freed temporaries, which the advice does not change: how much of a model sat in huge pages then
// depended on the heap's history. Buffers are carved from the current arena one after another, so a layer's small
// weights share huge pages too; an arena is unmapped when the last tensor in it goes, and the next buffer then
// starts a new one. Advice only: where Linux has no THP the pages stay as they are.
class WeightArenas {
 public:
  // [begin, begin + bytes), 64-byte aligned, and the arena that holds it (kept alive by the tensor's deleter)
  std::pair<uint8_t*, std::shared_ptr<void>> take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<void> arena = current_.lock();
    const size_t need = (bytes + 63) & ~size_t{63};
    if (!arena || used_ + need > size_) {
      size_ = std::max(kArenaBytes, (need + kHuge - 1) & ~(kHuge - 1));
      arena = map(size_);
      current_ = arena;
      used_ = 0;
    }
    uint8_t* begin = static_cast<uint8_t*>(arena.get()) + used_;
    used_ += need;
    return {begin, arena};
  }

 private:
  static constexpr size_t kHuge = size_t{2} << 20;
  static constexpr size_t kArenaBytes = size_t{64} << 20;   // virtual: pages nobody writes stay unbacked

  static std::shared_ptr<void> map(size_t bytes) {
    // one huge page more than asked, so that an aligned start fits; the mapping is unmapped whole
    const size_t mapped = bytes + kHuge;
    void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    require(base != MAP_FAILED, "fd_cpu_pack_weight: mmap of " + std::to_string(mapped) + " bytes for packed "
                                "weights failed: " + std::strerror(errno));
    const auto aligned = (reinterpret_cast<uintptr_t>(base) + kHuge - 1) & ~(kHuge - 1);
    madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
    return std::shared_ptr<void>(reinterpret_cast<void*>(aligned), [base, mapped](void*) { munmap(base, mapped); });
  }

  std::mutex mu_;
  std::weak_ptr<void> current_;
  size_t used_ = 0, size_ = 0;
};

paddle::Tensor packed_buffer(size_t bytes) {
  static WeightArenas arenas;
  auto [begin, arena] = arenas.take(bytes);
  return paddle::from_blob(begin, {static_cast<int64_t>(bytes)}, paddle::DataType::UINT8, phi::DataLayout::NCHW,
                           // the tensor's hold on its arena, let go when Paddle frees the tensor's memory
                           paddle::CPUPlace(), [arena = std::move(arena)](void*) mutable { arena.reset(); });
}

std::vector<paddle::Tensor> PackWeightImpl(const paddle::Tensor& w, int kind, int kernel) {
  require(w.is_cpu() && w.shape().size() == 2, "fd_cpu_pack_weight: argument 'w' must be a 2-D CPU tensor [K, N]");
  const int64_t k = w.shape()[0], n = w.shape()[1];
  check_kind_kernel("fd_cpu_pack_weight", kind, kernel);
  const bool real = kind == kBf16 || kind == kF32;
  require(w.dtype() == (real ? paddle::DataType::FLOAT32 : paddle::DataType::INT8),
          "fd_cpu_pack_weight: argument 'w' must be float32 for kinds 0 (bf16) and 3 (float32), int8 for kinds 1, 2");
  if (kind == kInt4 || kind == kInt8) {   // int8: -128 has no sign-magnitude form (OPS §10.5)
    const int lo = kind == kInt4 ? -8 : -127, hi = kind == kInt4 ? 7 : 127;
    const int8_t* src = w.data<int8_t>();
    const bool in_range = std::all_of(src, src + k * n, [lo, hi](int8_t v) { return v >= lo && v <= hi; });
    require(in_range, "fd_cpu_pack_weight: " + std::string(kind == kInt4 ? "int4" : "int8") + " values must be in [" +
                          std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  if (kernel == kDpbf16) {
    auto packed = packed_buffer(fd_cpu::dpbf16_packed_bytes(k, n, kind));
    fd_cpu::dpbf16_pack(w.data(), k, n, kind, packed.data<uint8_t>());
    return {packed};
  }
  const dt src_type = kind == kBf16 ? dt::f32 : dt::s8;
  const memory::desc packed_md = weights_desc(k, n, kind);
  auto packed = packed_buffer(packed_md.get_size());
  if (kind == kInt4) {   // element j of a row in the low nibble of byte j / 2 when j is even
    const int8_t* src = w.data<int8_t>();
    uint8_t* dst = packed.data<uint8_t>();
    const int64_t row_bytes = stored_n(n, kind) / 2;
    std::memset(dst, 0, packed_md.get_size());
    for (int64_t r = 0; r < k; ++r)
      for (int64_t j = 0; j < n; ++j)
        dst[r * row_bytes + j / 2] |= static_cast<uint8_t>((src[r * n + j] & 0xF) << ((j & 1) * 4));
    return {packed};
  }
  memory plain(memory::desc({k, n}, src_type, tag::ab), cpu_engine(), const_cast<void*>(w.data()));
  memory out(packed_md, cpu_engine(), packed.data<uint8_t>());
  dnnl::reorder(plain, out).execute(cpu_stream(), plain, out);   // f32 -> bf16 rounds to nearest even
  cpu_stream().wait();
  return {packed};
}

std::vector<paddle::Tensor> PackWeight(const paddle::Tensor& w, int kind, int kernel) {
  try {
    return PackWeightImpl(w, kind, kernel);
  } catch (const dnnl::error& e) {
    PD_THROW("fd_cpu_pack_weight: oneDNN: ", e.what());
  }
}

std::vector<std::vector<int64_t>> PackWeightShape(const std::vector<int64_t>&, int, int) { return {{-1}}; }
std::vector<paddle::DataType> PackWeightDtype(const paddle::DataType&) { return {paddle::DataType::UINT8}; }

PD_BUILD_OP(fd_cpu_pack_weight)
    .Inputs({"w"})
    .Outputs({"packed"})
    .Attrs({"kind: int", "kernel: int"})
    .SetInferShapeFn(PD_INFER_SHAPE(PackWeightShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(PackWeightDtype))
    .SetKernelFn(PD_KERNEL(PackWeight));

// ---- fd_cpu_linear ----

// oneDNN's product; scales [N] (an odd N of int4 computes into a padded scratch row, its pad column scaled by 0)
void onednn_linear(const paddle::Tensor& x, const paddle::Tensor& packed, const paddle::Tensor& scales, int64_t m,
                   int64_t k, int64_t n, int kind, float* out) {
  const int64_t n_stored = stored_n(n, kind);
  const Step& step = step_for(m, k, n, kind);
  require(static_cast<size_t>(packed.numel()) == step.weights.get_size(),
          "fd_cpu_linear: argument 'packed' is not fd_cpu_pack_weight's output for this K, N, kind and kernel");
  auto& eng = cpu_engine();
  auto& s = cpu_stream();
  thread_local std::vector<uint16_t> x16_buf;
  x16_buf.resize(static_cast<size_t>(m * k));
  memory x32(memory::desc({m, k}, dt::f32, tag::ab), eng, const_cast<void*>(x.data()));
  memory x16(memory::desc({m, k}, dt::bf16, tag::ab), eng, x16_buf.data());
  step.to_bf16.execute(s, x32, x16);
  float* dst = out;
  std::vector<float> padded, padded_scales;
  const float* scale_data = kind == kBf16 ? nullptr : scales.data<float>();
  if (n_stored != n) {
    padded.resize(static_cast<size_t>(m * n_stored));
    dst = padded.data();
    padded_scales.assign(scale_data, scale_data + n);
    padded_scales.push_back(0.0f);
    scale_data = padded_scales.data();
  }
  memory w(step.weights, eng, const_cast<void*>(packed.data())), o(memory::desc({m, n_stored}, dt::f32, tag::ab), eng, dst);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, x16}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, o}};
  if (kind != kBf16) {
    args.emplace(DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS,
                 memory(memory::desc({n_stored}, dt::f32, tag::a), eng, const_cast<float*>(scale_data)));
  }
  step.matmul.execute(s, args);
  s.wait();
  if (n_stored != n) {
    for (int64_t r = 0; r < m; ++r) std::memcpy(out + r * n, dst + r * n_stored, n * sizeof(float));
  }
}

std::vector<paddle::Tensor> CpuLinearImpl(const paddle::Tensor& x, const paddle::Tensor& packed,
                                          const paddle::Tensor& scales, int64_t k, int64_t n, int kind, int kernel) {
  require(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32 && x.shape().size() == 2 && x.shape()[1] == k,
          "fd_cpu_linear: argument 'x' must be a float32 CPU tensor [M, " + std::to_string(k) + "]");
  check_kind_kernel("fd_cpu_linear", kind, kernel);
  require(packed.dtype() == paddle::DataType::UINT8,
          "fd_cpu_linear: argument 'packed' is not fd_cpu_pack_weight's output (uint8)");
  require(kind == kBf16 || kind == kF32 || (scales.dtype() == paddle::DataType::FLOAT32 && scales.numel() == n),
          "fd_cpu_linear: argument 'scales' must be float32 [" + std::to_string(n) + "]");
  const int64_t m = x.shape()[0];
  auto out = paddle::empty({m, n}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  if (kernel == kDpbf16) {
    require(static_cast<size_t>(packed.numel()) == fd_cpu::dpbf16_packed_bytes(k, n, kind),
            "fd_cpu_linear: argument 'packed' is not fd_cpu_pack_weight's output for this K, N, kind and kernel");
    fd_cpu::dpbf16_linear(x.data<float>(), m, k, n, kind, packed.data<uint8_t>(),
                          kind == kBf16 || kind == kF32 ? nullptr : scales.data<float>(), out.data<float>());
  } else if (m > 0) {
    onednn_linear(x, packed, scales, m, k, n, kind, out.data<float>());
  }
  return {out};
}

std::vector<paddle::Tensor> CpuLinear(const paddle::Tensor& x, const paddle::Tensor& packed,
                                      const paddle::Tensor& scales, int64_t k, int64_t n, int kind, int kernel) {
  try {
    return CpuLinearImpl(x, packed, scales, k, n, kind, kernel);
  } catch (const dnnl::error& e) {
    PD_THROW("fd_cpu_linear: oneDNN: ", e.what());
  }
}

std::vector<std::vector<int64_t>> CpuLinearShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                                 const std::vector<int64_t>&, int64_t, int64_t n, int, int) {
  return {{x[0], n}};
}
std::vector<paddle::DataType> CpuLinearDtype(const paddle::DataType&, const paddle::DataType&,
                                             const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_cpu_linear)
    .Inputs({"x", "packed", "scales"})
    .Outputs({"out"})
    .Attrs({"k: int64_t", "n: int64_t", "kind: int", "kernel: int"})
    .SetInferShapeFn(PD_INFER_SHAPE(CpuLinearShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(CpuLinearDtype))
    .SetKernelFn(PD_KERNEL(CpuLinear));

// ---- fd_cpu_packed_columns ----

std::vector<paddle::Tensor> PackedColumns(const paddle::Tensor& packed, const paddle::Tensor& ids, int64_t k,
                                          int64_t n, int kind, int kernel) {
  check_kind_kernel("fd_cpu_packed_columns", kind, kernel);
  require(kernel == kDpbf16 && (kind == kBf16 || kind == kF32),
          "fd_cpu_packed_columns: arguments 'kind', 'kernel': columns are read from kernel 1's bf16 or float32 layout");
  require(packed.dtype() == paddle::DataType::UINT8 &&
              static_cast<size_t>(packed.numel()) == fd_cpu::dpbf16_packed_bytes(k, n, kind),
          "fd_cpu_packed_columns: argument 'packed' is not fd_cpu_pack_weight's output for this K, N, kind and kernel");
  require(ids.is_cpu() && ids.dtype() == paddle::DataType::INT64 && ids.shape().size() == 1,
          "fd_cpu_packed_columns: argument 'ids' must be a 1-D int64 CPU tensor");
  const int64_t count = ids.shape()[0];
  const int64_t* id = ids.data<int64_t>();
  for (int64_t i = 0; i < count; ++i)   // the message is built only for a bad id
    if (id[i] < 0 || id[i] >= n)
      require(false, "fd_cpu_packed_columns: argument 'ids' holds " + std::to_string(id[i]) + ", outside [0, " +
                         std::to_string(n) + ")");
  auto out = paddle::empty({count, k}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  fd_cpu::dpbf16_columns(packed.data<uint8_t>(), k, n, kind, id, count, out.data<float>());
  return {out};
}

std::vector<std::vector<int64_t>> PackedColumnsShape(const std::vector<int64_t>&, const std::vector<int64_t>& ids,
                                                     int64_t k, int64_t, int, int) {
  return {{ids[0], k}};
}
std::vector<paddle::DataType> PackedColumnsDtype(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_cpu_packed_columns)
    .Inputs({"packed", "ids"})
    .Outputs({"out"})
    .Attrs({"k: int64_t", "n: int64_t", "kind: int", "kernel: int"})
    .SetInferShapeFn(PD_INFER_SHAPE(PackedColumnsShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(PackedColumnsDtype))
    .SetKernelFn(PD_KERNEL(PackedColumns));
