// Paddle op speculate_save_output (OPS §5.7). Outputs: msg (new host int64 tensor) and preempted_idx (in place).
#include "common/mtp_calls.h"
#include "mtp/op_signatures.h"
#include "mtp/paddle_args.h"

namespace {

int64_t* alloc_paddle_msg(int64_t numel, void* user) {
  auto* msg = static_cast<paddle::Tensor*>(user);
  *msg = paddle::empty({numel}, paddle::DataType::INT64, paddle::CPUPlace());
  return numel > 0 ? msg->data<int64_t>() : nullptr;
}

}  // namespace

std::vector<paddle::Tensor> SpeculateSaveOutput(const paddle::Tensor& accept_tokens,     // [bsz, T] int64
                                                const paddle::Tensor& accept_num,        // [bsz] / [bsz, 1] int32
                                                const paddle::Tensor& not_need_stop,     // [1] bool, host
                                                const paddle::Tensor& seq_lens_decoder,  // [bsz] / [bsz, 1] int32
                                                const paddle::Tensor& prompt_lens,       // [bsz] / [bsz, 1] int64
                                                paddle::Tensor& preempted_idx,           // [bsz] / [bsz, 1] int32, host
                                                int rank_id, bool save_each_rank, bool skip_prefill, int ncluster) {
  using fd_ops::to_arg;
  paddle::Tensor msg;  // [2 + bsz + bsz * T] int64, host; [0] when this rank sends nothing
  try {
    fd_ops::speculate_save_output(to_arg(accept_tokens), to_arg(accept_num), to_arg(not_need_stop),
                                  to_arg(seq_lens_decoder), to_arg(prompt_lens), to_arg(preempted_idx), rank_id,
                                  save_each_rank, skip_prefill, ncluster, alloc_paddle_msg, &msg);
  } catch (const fd_ops::OpError& e) {
    fd_ops::throw_paddle(e);
  }
  return {msg};
}

std::vector<std::vector<int64_t>> SpeculateSaveOutputInferShape(
    const std::vector<int64_t>& accept_tokens_shape, const std::vector<int64_t>& accept_num_shape,
    const std::vector<int64_t>& not_need_stop_shape, const std::vector<int64_t>& seq_lens_decoder_shape,
    const std::vector<int64_t>& prompt_lens_shape, const std::vector<int64_t>& preempted_idx_shape, int rank_id,
    bool save_each_rank, bool skip_prefill, int ncluster) {
  if (!save_each_rank && rank_id > 0) {
    return {{0}};
  }
  const int64_t bsz = accept_tokens_shape[0];
  const int64_t T = accept_tokens_shape[1];
  return {{2 + bsz + bsz * T}};
}

std::vector<paddle::DataType> SpeculateSaveOutputInferDtype(
    const paddle::DataType& accept_tokens, const paddle::DataType& accept_num, const paddle::DataType& not_need_stop,
    const paddle::DataType& seq_lens_decoder, const paddle::DataType& prompt_lens,
    const paddle::DataType& preempted_idx) {
  return {paddle::DataType::INT64};
}

PD_BUILD_OP(speculate_save_output)
    SPECULATE_SAVE_OUTPUT_SIGNATURE
    .SetInferShapeFn(PD_INFER_SHAPE(SpeculateSaveOutputInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SpeculateSaveOutputInferDtype))
    .SetKernelFn(PD_KERNEL(SpeculateSaveOutput));
