// fd_cpu_decoder_stack (OPS §13.4): a decode or verify pass through a stack of dense decoder layers as one op: each
// layer's attention half (fd_cpu_attention_block, OPS §13.3) then its MLP half (fd_cpu_swiglu_mlp, OPS §13.1), the
// residual stream carried unsummed from layer to layer as the model carries it, so its outputs and the cache's
// writes are those two ops' layer after layer, bit for bit. Why one op: between two layers the host ran the
// model's loop and the layers' Python after each half had streamed megabytes of weights through the caches (two
// gaps a layer, ~100 us at batch 1: docs/benchmarks.md "One op for a layer's attention"); here none is left.
//
// AttentionBlock and SwigluMlp are defined earlier in this extension's one translation unit (setup.py; see
// attention_block.cc for why they are not declared again here).
#include <string>
#include <vector>

#include "paged_cache.h"
#include "paddle/extension.h"

namespace {
constexpr const char* kStackOp = "fd_cpu_decoder_stack";
}  // namespace

std::vector<paddle::Tensor> DecoderStack(
    const paddle::Tensor& x, const paddle::Tensor& residual, const paddle::Tensor& cos, const paddle::Tensor& sin,
    const paddle::Tensor& write_rows, const paddle::Tensor& ctx_rows, const paddle::Tensor& token_seq,
    const paddle::Tensor& token_len, const std::vector<paddle::Tensor>& caches,
    const std::vector<paddle::Tensor>& attn_norm, const std::vector<paddle::Tensor>& qkv,
    const std::vector<paddle::Tensor>& qkv_scales, const std::vector<paddle::Tensor>& o_proj,
    const std::vector<paddle::Tensor>& o_proj_scales, const std::vector<paddle::Tensor>& mlp_norm,
    const std::vector<paddle::Tensor>& gate_up, const std::vector<paddle::Tensor>& gate_up_scales,
    const std::vector<paddle::Tensor>& down, const std::vector<paddle::Tensor>& down_scales, float eps,
    int64_t hidden, int64_t intermediate, int64_t num_heads, bool interleaved, float scale, int qkv_kind,
    int qkv_kernel, int o_proj_kind, int o_proj_kernel, int gate_up_kind, int gate_up_kernel, int down_kind,
    int down_kernel) {
  const size_t layers = caches.size();
  fd_cpu::require(layers > 0, kStackOp, "argument 'caches' must hold one cache layer a decoder layer (none given)");
  for (const auto* list : {&attn_norm, &qkv, &qkv_scales, &o_proj, &o_proj_scales, &mlp_norm, &gate_up,
                           &gate_up_scales, &down, &down_scales})
    fd_cpu::require(list->size() == layers, kStackOp,
                    "every list argument must hold one tensor a layer (" + std::to_string(layers) + " caches)");
  paddle::Tensor h = x, res = residual;
  for (size_t l = 0; l < layers; ++l) {
    const std::string layer = "layer " + std::to_string(l);
    auto attended = fd_cpu::stage(kStackOp, layer, [&] {
      return AttentionBlock(h, res, attn_norm[l], qkv[l], qkv_scales[l], cos, sin, caches[l], write_rows, ctx_rows,
                            token_seq, token_len, o_proj[l], o_proj_scales[l], eps, hidden, num_heads, interleaved,
                            scale, qkv_kind, qkv_kernel, o_proj_kind, o_proj_kernel);
    });
    auto mlp = fd_cpu::stage(kStackOp, layer, [&] {
      return SwigluMlp(attended[0], attended[1], mlp_norm[l], gate_up[l], gate_up_scales[l], down[l],
                       down_scales[l], eps, hidden, intermediate, gate_up_kind, gate_up_kernel, down_kind,
                       down_kernel);
    });
    h = mlp[0];
    res = mlp[1];
  }
  return {h, res};
}

using Shape = std::vector<int64_t>;
using Shapes = std::vector<Shape>;
using Dtype = paddle::DataType;
using Dtypes = std::vector<paddle::DataType>;

std::vector<Shape> DecoderStackShape(const Shape& x, const Shape&, const Shape&, const Shape&, const Shape&,
                                     const Shape&, const Shape&, const Shape&, const Shapes&, const Shapes&,
                                     const Shapes&, const Shapes&, const Shapes&, const Shapes&, const Shapes&,
                                     const Shapes&, const Shapes&, const Shapes&, const Shapes&, float, int64_t hidden,
                                     int64_t, int64_t, bool, float, int, int, int, int, int, int, int, int) {
  return {{x[0], hidden}, {x[0], hidden}};
}
Dtypes DecoderStackDtype(const Dtype&, const Dtype&, const Dtype&, const Dtype&, const Dtype&, const Dtype&,
                         const Dtype&, const Dtype&, const Dtypes&, const Dtypes&, const Dtypes&, const Dtypes&,
                         const Dtypes&, const Dtypes&, const Dtypes&, const Dtypes&, const Dtypes&, const Dtypes&,
                         const Dtypes&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_cpu_decoder_stack)
    .Inputs({"x", "residual", "cos", "sin", "write_rows", "ctx_rows", "token_seq", "token_len", paddle::Vec("caches"),
             paddle::Vec("attn_norm"), paddle::Vec("qkv"), paddle::Vec("qkv_scales"), paddle::Vec("o_proj"),
             paddle::Vec("o_proj_scales"), paddle::Vec("mlp_norm"), paddle::Vec("gate_up"),
             paddle::Vec("gate_up_scales"), paddle::Vec("down"), paddle::Vec("down_scales")})
    .Outputs({"out", "residual_out"})
    .Attrs({"eps: float", "hidden: int64_t", "intermediate: int64_t", "num_heads: int64_t", "interleaved: bool",
            "scale: float", "qkv_kind: int", "qkv_kernel: int", "o_proj_kind: int", "o_proj_kernel: int",
            "gate_up_kind: int", "gate_up_kernel: int", "down_kind: int", "down_kernel: int"})
    .SetInferShapeFn(PD_INFER_SHAPE(DecoderStackShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DecoderStackDtype))
    .SetKernelFn(PD_KERNEL(DecoderStack));
