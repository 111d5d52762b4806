// Paddle op speculate_update (OPS §5.1). In place: seq_lens_encoder, seq_lens_decoder, not_need_stop,
// draft_tokens, actual_draft_token_nums, mask_rollback.
#include "common/mtp_calls.h"
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
    .Inputs({"seq_lens_encoder", "seq_lens_decoder", "not_need_stop", "draft_tokens", "actual_draft_token_nums",
             "accept_tokens", "accept_num", "stop_flags", "seq_lens_this_time", "is_block_step", "mask_rollback"})
    .Outputs({"seq_lens_encoder_out", "seq_lens_decoder_out", "not_need_stop_out", "draft_tokens_out",
              "actual_draft_token_nums_out", "mask_rollback_out"})
    .Attrs({"ncluster: int"})
    .SetInplaceMap({{"seq_lens_encoder", "seq_lens_encoder_out"},
                    {"seq_lens_decoder", "seq_lens_decoder_out"},
                    {"not_need_stop", "not_need_stop_out"},
                    {"draft_tokens", "draft_tokens_out"},
                    {"actual_draft_token_nums", "actual_draft_token_nums_out"},
                    {"mask_rollback", "mask_rollback_out"}})
    .SetKernelFn(PD_KERNEL(SpeculateUpdate));
