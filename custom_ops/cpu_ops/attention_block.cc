// fd_cpu_attention_block (OPS §13.3): the first half of a decoder layer over decode / verify rows, RMSNorm (after
// the residual add), the q|k|v product, the rotation and cache write, the attention over the paged cache and the
// output product, as one op: fd_cpu_rms_norm's, fd_cpu_linear's, fd_cpu_rope_cache_write's and
// fd_cpu_decode_attention's kernels called in turn, so its outputs and the cache's writes are theirs bit for bit.
// Why one op: as fd_cpu_swiglu_mlp (OPS §13.1), the host's code between the ops of a decode step runs after each
// product has streamed its weights through the caches; here four of those gaps a layer go.
#include <string>
#include <vector>

#include "paged_cache.h"
#include "paddle/extension.h"

// RmsNorm, CpuLinear, RopeCacheWrite and DecodeAttention are defined earlier in this extension's one translation
// unit (setup.py), as python_calls.cc uses them: declared again here under another `#pragma GCC target` than their
// definitions', GCC would take the declarations for other versions of them.

namespace {
constexpr const char* kBlockOp = "fd_cpu_attention_block";
}  // namespace

std::vector<paddle::Tensor> AttentionBlock(const paddle::Tensor& x, const paddle::Tensor& residual,
                                           const paddle::Tensor& norm_weight, const paddle::Tensor& qkv,
                                           const paddle::Tensor& qkv_scales, const paddle::Tensor& cos,
                                           const paddle::Tensor& sin, const paddle::Tensor& cache,
                                           const paddle::Tensor& write_rows, const paddle::Tensor& ctx_rows,
                                           const paddle::Tensor& token_seq, const paddle::Tensor& token_len,
                                           const paddle::Tensor& o_proj, const paddle::Tensor& o_proj_scales,
                                           float eps, int64_t hidden, int64_t num_heads, bool interleaved, float scale,
                                           int qkv_kind, int qkv_kernel, int o_proj_kind, int o_proj_kernel) {
  const auto layer = fd_cpu::check_cache(kBlockOp, cache);
  fd_cpu::require(hidden > 0 && num_heads > 0 && num_heads % layer.nkv == 0, kBlockOp,
                  "attributes 'hidden' and 'num_heads' must be positive, 'num_heads' a multiple of the cache's KV "
                  "heads");
  fd_cpu::require(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32 && x.shape().size() == 2 &&
                      x.shape()[1] == hidden,
                  kBlockOp, "argument 'x' must be a float32 CPU tensor [M, " + std::to_string(hidden) + "]");
  const int64_t m = x.shape()[0], q_size = num_heads * layer.hd;
  // the first layer has no residual yet: x itself is what the next add starts from
  auto normed = fd_cpu::stage(kBlockOp, "norm", [&] { return RmsNorm(x, norm_weight, residual, eps); });
  const paddle::Tensor summed = residual.numel() == 0 ? x : normed[1];
  auto heads = fd_cpu::stage(kBlockOp, "qkv", [&] {
    return CpuLinear(normed[0], qkv, qkv_scales, hidden, q_size + 2 * layer.nkv * layer.hd, qkv_kind, qkv_kernel);
  });
  auto q = fd_cpu::stage(kBlockOp, "rope_cache_write", [&] {
    return RopeCacheWrite(heads[0], cos, sin, cache, write_rows, num_heads, interleaved);
  });
  auto attended = fd_cpu::stage(kBlockOp, "attention", [&] {
    return DecodeAttention(q[0], cache, ctx_rows, token_seq, token_len, scale);
  });
  auto projected = fd_cpu::stage(kBlockOp, "o_proj", [&] {
    return CpuLinear(paddle::experimental::reshape(attended[0], {m, q_size}), o_proj, o_proj_scales, q_size, hidden,
                     o_proj_kind, o_proj_kernel);
  });
  return {projected[0], summed};
}

std::vector<std::vector<int64_t>> AttentionBlockShape(
    const std::vector<int64_t>& x, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&, float, int64_t hidden, int64_t, bool, float, int, int,
    int, int) {
  return {{x[0], hidden}, x};
}
std::vector<paddle::DataType> AttentionBlockDtype(
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_cpu_attention_block)
    .Inputs({"x", "residual", "norm_weight", "qkv", "qkv_scales", "cos", "sin", "cache", "write_rows", "ctx_rows",
             "token_seq", "token_len", "o_proj", "o_proj_scales"})
    .Outputs({"out", "residual_out"})
    .Attrs({"eps: float", "hidden: int64_t", "num_heads: int64_t", "interleaved: bool", "scale: float",
            "qkv_kind: int", "qkv_kernel: int", "o_proj_kind: int", "o_proj_kernel: int"})
    .SetInferShapeFn(PD_INFER_SHAPE(AttentionBlockShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AttentionBlockDtype))
    .SetKernelFn(PD_KERNEL(AttentionBlock));
