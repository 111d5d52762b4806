// Paddle op speculate_schedule_cache (OPS §5.4). In place: every argument except draft_tokens, block_tables and
// prompt_lens, which are read-only and deliberately not declared.
#include "common/mtp_calls.h"
#include "mtp/op_signatures.h"
#include "mtp/paddle_args.h"

void SpeculateScheduleCache(const paddle::Tensor& draft_tokens,       // [B, T] int64
                            const paddle::Tensor& block_tables,       // [B, NB] int32
                            paddle::Tensor& stop_flags,               // [B] / [B, 1] bool
                            const paddle::Tensor& prompt_lens,        // [B] / [B, 1] int64
                            paddle::Tensor& seq_lens_this_time,       // [R] / [R, 1] int32
                            paddle::Tensor& seq_lens_encoder,         // [B] / [B, 1] int32
                            paddle::Tensor& seq_lens_decoder,         // [B] / [B, 1] int32
                            paddle::Tensor& step_seq_lens_decoder,    // [B] / [B, 1] int32
                            paddle::Tensor& step_draft_tokens,        // [B, T] int64
                            paddle::Tensor& step_seq_lens_this_time,  // [B] / [B, 1] int32
                            paddle::Tensor& accept_num,               // [B] / [B, 1] int32
                            paddle::Tensor& accept_tokens,            // [B, T] int64
                            paddle::Tensor& is_block_step,            // [B] / [B, 1] bool
                            paddle::Tensor& not_need_stop,            // [1] bool, host
                            int block_size, int max_draft_tokens, bool prefill_one_step_stop, int ncluster) {
  using fd_ops::to_arg;
  try {
    fd_ops::speculate_schedule_cache(to_arg(draft_tokens), to_arg(block_tables), to_arg(stop_flags),
                                     to_arg(prompt_lens), to_arg(seq_lens_this_time), to_arg(seq_lens_encoder),
                                     to_arg(seq_lens_decoder), to_arg(step_seq_lens_decoder),
                                     to_arg(step_draft_tokens), to_arg(step_seq_lens_this_time), to_arg(accept_num),
                                     to_arg(accept_tokens), to_arg(is_block_step), to_arg(not_need_stop), block_size,
                                     max_draft_tokens, prefill_one_step_stop, ncluster);
  } catch (const fd_ops::OpError& e) {
    fd_ops::throw_paddle(e);
  }
}

PD_BUILD_OP(speculate_schedule_cache)
    SPECULATE_SCHEDULE_CACHE_SIGNATURE
    .SetKernelFn(PD_KERNEL(SpeculateScheduleCache));
