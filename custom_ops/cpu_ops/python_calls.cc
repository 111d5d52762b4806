// fastdeploy.model_executor.ops._cpu_linear as a Python module: each CPU op's kernel function as a function of the
// same name, which the layers call instead of `paddle._C_ops._run_custom_op("fd_cpu_...", ...)`. Same arguments,
// checks, outputs and bits as the registered op (OPS §10-§13); what differs is the call's cost. Paddle 3.3's eager
// `_run_custom_op` copies the whole registry of custom ops' metadata (every registered op's input, output and
// attribute names) on every call, so its cost grows with the ops a process has registered: measured here ~9 us a
// call with this extension's ops alone and ~35 us once the state ops (`_paddle_ops`) are registered too, against
// ~3 us through this module, the kernel included (docs/benchmarks.md "Ops latency"). A decode pass calls these ops
// several times a layer. Inputs that are not contiguous are made so, as Paddle's entry does; the kernels run
// without the GIL, as Paddle's ops do, so the process's other threads (the KV connector's) go on meanwhile.
#include "paddle/extension.h"
#include "paddle/utils/pybind.h"

namespace {

namespace py = pybind11;

paddle::Tensor dense(const paddle::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

std::vector<paddle::Tensor> all_dense(const std::vector<paddle::Tensor>& ts) {
  std::vector<paddle::Tensor> out;
  for (const auto& t : ts) out.push_back(dense(t));
  return out;
}

// A tensor an op writes in place: a contiguous copy would take the writes.
const paddle::Tensor& in_place(const paddle::Tensor& t, const char* op, const char* name) {
  PD_CHECK(t.is_contiguous(), op, ": argument '", name, "' must be contiguous (the op writes it in place)");
  return t;
}

}  // namespace

PYBIND11_MODULE(_cpu_linear, m) {
  m.doc() = "The CPU ops' kernels called directly (custom_ops/cpu_ops/python_calls.cc); each returns the list of "
            "outputs the registered fd_cpu_* op of the same name returns.";
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("fd_cpu_pack_weight", [](const paddle::Tensor& w, int kind, int kernel) {
    return PackWeight(dense(w), kind, kernel);
  }, no_gil);
  m.def("fd_cpu_linear", [](const paddle::Tensor& x, const paddle::Tensor& packed, const paddle::Tensor& scales,
                            int64_t k, int64_t n, int kind, int kernel) {
    return CpuLinear(dense(x), dense(packed), dense(scales), k, n, kind, kernel);
  }, no_gil);
  m.def("fd_cpu_packed_columns", [](const paddle::Tensor& packed, const paddle::Tensor& ids, int64_t k, int64_t n,
                                    int kind, int kernel) {
    return PackedColumns(dense(packed), dense(ids), k, n, kind, kernel);
  }, no_gil);
  m.def("fd_cpu_decode_attention", [](const paddle::Tensor& q, const paddle::Tensor& cache,
                                      const paddle::Tensor& ctx_rows, const paddle::Tensor& token_seq,
                                      const paddle::Tensor& token_len, float scale) {
    return DecodeAttention(dense(q), dense(cache), dense(ctx_rows), dense(token_seq), dense(token_len), scale);
  }, no_gil);
  m.def("fd_cpu_prefill_attention", [](const paddle::Tensor& q, const paddle::Tensor& cache,
                                       const paddle::Tensor& ctx_rows, float scale) {
    return PrefillAttention(dense(q), dense(cache), dense(ctx_rows), scale);
  }, no_gil);
  m.def("fd_cpu_rope_cache_write", [](const paddle::Tensor& qkv, const paddle::Tensor& cos, const paddle::Tensor& sin,
                                      const paddle::Tensor& cache, const paddle::Tensor& rows, int64_t num_heads,
                                      bool interleaved) {
    return RopeCacheWrite(dense(qkv), dense(cos), dense(sin), in_place(cache, "fd_cpu_rope_cache_write", "cache"),
                          dense(rows), num_heads, interleaved);
  }, no_gil);
  m.def("fd_cpu_rms_norm", [](const paddle::Tensor& x, const paddle::Tensor& weight, const paddle::Tensor& residual,
                              float eps) {
    return RmsNorm(dense(x), dense(weight), dense(residual), eps);
  }, no_gil);
  m.def("fd_cpu_swiglu_mlp", [](const paddle::Tensor& x, const paddle::Tensor& residual,
                                const paddle::Tensor& norm_weight, const paddle::Tensor& gate_up,
                                const paddle::Tensor& gate_up_scales, const paddle::Tensor& down,
                                const paddle::Tensor& down_scales, float eps, int64_t hidden, int64_t intermediate,
                                int gate_up_kind, int gate_up_kernel, int down_kind, int down_kernel) {
    return SwigluMlp(dense(x), dense(residual), dense(norm_weight), dense(gate_up), dense(gate_up_scales),
                     dense(down), dense(down_scales), eps, hidden, intermediate, gate_up_kind, gate_up_kernel,
                     down_kind, down_kernel);
  }, no_gil);
  m.def("fd_cpu_attention_block", [](const paddle::Tensor& x, const paddle::Tensor& residual,
                                     const paddle::Tensor& norm_weight, const paddle::Tensor& qkv,
                                     const paddle::Tensor& qkv_scales, const paddle::Tensor& cos,
                                     const paddle::Tensor& sin, const paddle::Tensor& cache,
                                     const paddle::Tensor& write_rows, const paddle::Tensor& ctx_rows,
                                     const paddle::Tensor& token_seq, const paddle::Tensor& token_len,
                                     const paddle::Tensor& o_proj, const paddle::Tensor& o_proj_scales, float eps,
                                     int64_t hidden, int64_t num_heads, bool interleaved, float scale, int qkv_kind,
                                     int qkv_kernel, int o_proj_kind, int o_proj_kernel) {
    return AttentionBlock(dense(x), dense(residual), dense(norm_weight), dense(qkv), dense(qkv_scales), dense(cos),
                          dense(sin), in_place(cache, "fd_cpu_attention_block", "cache"), dense(write_rows),
                          dense(ctx_rows), dense(token_seq), dense(token_len), dense(o_proj), dense(o_proj_scales),
                          eps, hidden, num_heads, interleaved, scale, qkv_kind, qkv_kernel, o_proj_kind,
                          o_proj_kernel);
  }, no_gil);
  m.def("fd_cpu_decoder_stack", [](const paddle::Tensor& x, const paddle::Tensor& residual, const paddle::Tensor& cos,
                                   const paddle::Tensor& sin, const paddle::Tensor& write_rows,
                                   const paddle::Tensor& ctx_rows, const paddle::Tensor& token_seq,
                                   const paddle::Tensor& token_len, const std::vector<paddle::Tensor>& caches,
                                   const std::vector<paddle::Tensor>& attn_norm, const std::vector<paddle::Tensor>& qkv,
                                   const std::vector<paddle::Tensor>& qkv_scales,
                                   const std::vector<paddle::Tensor>& o_proj,
                                   const std::vector<paddle::Tensor>& o_proj_scales,
                                   const std::vector<paddle::Tensor>& mlp_norm,
                                   const std::vector<paddle::Tensor>& gate_up,
                                   const std::vector<paddle::Tensor>& gate_up_scales,
                                   const std::vector<paddle::Tensor>& down,
                                   const std::vector<paddle::Tensor>& down_scales, float eps, int64_t hidden,
                                   int64_t intermediate, int64_t num_heads, bool interleaved, float scale,
                                   int qkv_kind, int qkv_kernel, int o_proj_kind, int o_proj_kernel, int gate_up_kind,
                                   int gate_up_kernel, int down_kind, int down_kernel) {
    for (const auto& cache : caches) in_place(cache, "fd_cpu_decoder_stack", "caches");
    return DecoderStack(dense(x), dense(residual), dense(cos), dense(sin), dense(write_rows), dense(ctx_rows),
                        dense(token_seq), dense(token_len), caches, all_dense(attn_norm), all_dense(qkv),
                        all_dense(qkv_scales), all_dense(o_proj), all_dense(o_proj_scales), all_dense(mlp_norm),
                        all_dense(gate_up), all_dense(gate_up_scales), all_dense(down), all_dense(down_scales), eps,
                        hidden, intermediate, num_heads, interleaved, scale, qkv_kind, qkv_kernel, o_proj_kind,
                        o_proj_kernel, gate_up_kind, gate_up_kernel, down_kind, down_kernel);
  }, no_gil);
  m.def("fd_cpu_moe_route", [](const paddle::Tensor& x, const paddle::Tensor& gate, const paddle::Tensor& bias,
                               int64_t top_k, float norm_min) {
    return MoeRoute(dense(x), dense(gate), dense(bias), top_k, norm_min);
  }, no_gil);
  m.def("fd_cpu_moe_experts", [](const paddle::Tensor& x, const paddle::Tensor& tokens, const paddle::Tensor& weights,
                                 const paddle::Tensor& run_ends, const std::vector<paddle::Tensor>& gate_up,
                                 const std::vector<paddle::Tensor>& gate_up_scales,
                                 const std::vector<paddle::Tensor>& down,
                                 const std::vector<paddle::Tensor>& down_scales,
                                 const paddle::Tensor& shared_gate_up, const paddle::Tensor& shared_gate_up_scales,
                                 const paddle::Tensor& shared_down, const paddle::Tensor& shared_down_scales,
                                 int64_t hidden, int64_t intermediate, int gate_up_kind, int gate_up_kernel,
                                 int down_kind, int down_kernel, int64_t shared_intermediate, int shared_gate_up_kind,
                                 int shared_gate_up_kernel, int shared_down_kind, int shared_down_kernel) {
    return MoeExperts(dense(x), dense(tokens), dense(weights), dense(run_ends), all_dense(gate_up),
                      all_dense(gate_up_scales), all_dense(down), all_dense(down_scales), dense(shared_gate_up),
                      dense(shared_gate_up_scales), dense(shared_down), dense(shared_down_scales), hidden,
                      intermediate, gate_up_kind, gate_up_kernel, down_kind, down_kernel, shared_intermediate,
                      shared_gate_up_kind, shared_gate_up_kernel, shared_down_kind, shared_down_kernel);
  }, no_gil);
}
