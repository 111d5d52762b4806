// Paddle op speculate_update (OPS §5.1). In place: seq_lens_encoder, seq_lens_decoder, not_need_stop,
// draft_tokens, actual_draft_token_nums, mask_rollback.
#include "common/mtp_calls.h"
#include "mtp/op_signatures.h"
#include "mtp/paddle_args.h"

void SpeculateUpdate(paddle::Tensor& seq_lens_encoder,             // [B] / [B, 1] int32
                     paddle::Tensor& seq_lens_decoder,             // [B] / [B, 1] int32
                     paddle::Tensor& not_need_stop,                // [1] bool, host
                     paddle::Tensor& draft_tokens,                 // [B, T] int64
                     paddle::Tensor& actual_draft_token_nums,      // [B] / [B, 1] int32
                     const paddle::Tensor& accept_tokens,          // [B, T] int64
                     const paddle::Tensor& accept_num,             // [B] / [B, 1] int32
                     const paddle::Tensor& stop_flags,             // [B] / [B, 1] bool
                     const paddle::Tensor& seq_lens_this_time,     // [R] / [R, 1] int32
                     const paddle::Tensor& is_block_step,          // [B] / [B, 1] bool
                     paddle::Tensor& mask_rollback,                // [B] / [B, 1] int32
                     int ncluster) {
  using fd_ops::to_arg;
  try {
    fd_ops::speculate_update(to_arg(seq_lens_encoder), to_arg(seq_lens_decoder), to_arg(not_need_stop),
                             to_arg(draft_tokens), to_arg(actual_draft_token_nums), to_arg(accept_tokens),
                             to_arg(accept_num), to_arg(stop_flags), to_arg(seq_lens_this_time),
                             to_arg(is_block_step), to_arg(mask_rollback), ncluster);
  } catch (const fd_ops::OpError& e) {
    fd_ops::throw_paddle(e);
  }
}

PD_BUILD_OP(speculate_update)
    SPECULATE_UPDATE_SIGNATURE
    .SetKernelFn(PD_KERNEL(SpeculateUpdate));
