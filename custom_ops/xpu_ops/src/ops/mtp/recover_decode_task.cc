// Paddle ops recover_decode_task (non-speculative) and recover_spec_decode_task (speculative), OPS §5.5.
// Two registrations so that each declares its complete in-place map: the speculative one also writes
// draft_tokens. fastdeploy.model_executor.ops.xpu.recover_decode_task picks one by whether the draft tensors
// are given.
#include "common/mtp_calls.h"
#include "mtp/op_signatures.h"
#include "mtp/paddle_args.h"

void RecoverDecodeTask(paddle::Tensor& stop_flags,                   // [B] / [B, 1] bool
                       paddle::Tensor& seq_lens_this_time,           // [R] / [R, 1] int32
                       paddle::Tensor& seq_lens_encoder,             // [B] / [B, 1] int32
                       paddle::Tensor& seq_lens_decoder,             // [B] / [B, 1] int32
                       const paddle::Tensor& step_seq_lens_decoder,  // [B] / [B, 1] int32
                       const paddle::Tensor& block_tables,           // [B, NB] int32
                       paddle::Tensor& is_block_step,                // [B] / [B, 1] bool
                       int block_size, int max_draft_tokens, int ncluster) {
  using fd_ops::to_arg;
  try {
    const fd_ops::TensorArg absent;
    fd_ops::recover_decode_task(to_arg(stop_flags), to_arg(seq_lens_this_time), to_arg(seq_lens_encoder),
                                to_arg(seq_lens_decoder), to_arg(step_seq_lens_decoder), to_arg(block_tables),
                                to_arg(is_block_step), absent, absent, absent, block_size, max_draft_tokens,
                                ncluster);
  } catch (const fd_ops::OpError& e) {
    fd_ops::throw_paddle(e);
  }
}

void RecoverSpecDecodeTask(paddle::Tensor& stop_flags,                     // [B] / [B, 1] bool
                           paddle::Tensor& seq_lens_this_time,             // [R] / [R, 1] int32
                           paddle::Tensor& seq_lens_encoder,               // [B] / [B, 1] int32
                           paddle::Tensor& seq_lens_decoder,               // [B] / [B, 1] int32
                           const paddle::Tensor& step_seq_lens_decoder,    // [B] / [B, 1] int32
                           const paddle::Tensor& block_tables,             // [B, NB] int32
                           paddle::Tensor& is_block_step,                  // [B] / [B, 1] bool
                           paddle::Tensor& draft_tokens,                   // [B, T] int64
                           const paddle::Tensor& step_draft_tokens,        // [B, T] int64
                           const paddle::Tensor& step_seq_lens_this_time,  // [B] / [B, 1] int32
                           int block_size, int max_draft_tokens, int ncluster) {
  using fd_ops::to_arg;
  try {
    fd_ops::recover_decode_task(to_arg(stop_flags), to_arg(seq_lens_this_time), to_arg(seq_lens_encoder),
                                to_arg(seq_lens_decoder), to_arg(step_seq_lens_decoder), to_arg(block_tables),
                                to_arg(is_block_step), to_arg(draft_tokens), to_arg(step_draft_tokens),
                                to_arg(step_seq_lens_this_time), block_size, max_draft_tokens, ncluster);
  } catch (const fd_ops::OpError& e) {
    fd_ops::throw_paddle(e);
  }
}

PD_BUILD_OP(recover_decode_task)
    RECOVER_DECODE_TASK_SIGNATURE
    .SetKernelFn(PD_KERNEL(RecoverDecodeTask));

PD_BUILD_OP(recover_spec_decode_task)
    RECOVER_SPEC_DECODE_TASK_SIGNATURE
    .SetKernelFn(PD_KERNEL(RecoverSpecDecodeTask));
