// Paddle op speculate_set_value_by_flags_and_idx (OPS §5.2). In place: pre_ids_all, accept_num,
// seq_lens_decoder.
#include "common/mtp_calls.h"
#include "mtp/op_signatures.h"
#include "mtp/paddle_args.h"

void SpeculateSetValueByFlagsAndIdx(paddle::Tensor& pre_ids_all,               // [B, M] int64
                                    const paddle::Tensor& accept_tokens,       // [B, T] int64
                                    paddle::Tensor& accept_num,                // [B] / [B, 1] int32
                                    const paddle::Tensor& stop_flags,          // [B] / [B, 1] bool
                                    const paddle::Tensor& seq_lens_this_time,  // [R] / [R, 1] int32 (length only)
                                    const paddle::Tensor& seq_lens_encoder,    // [B] / [B, 1] int32
                                    paddle::Tensor& seq_lens_decoder,          // [B] / [B, 1] int32
                                    const paddle::Tensor& step_idx,            // [B] / [B, 1] int64
                                    int ncluster) {
  using fd_ops::to_arg;
  try {
    fd_ops::speculate_set_value_by_flags_and_idx(to_arg(pre_ids_all), to_arg(accept_tokens), to_arg(accept_num),
                                                 to_arg(stop_flags), to_arg(seq_lens_this_time),
                                                 to_arg(seq_lens_encoder), to_arg(seq_lens_decoder),
                                                 to_arg(step_idx), ncluster);
  } catch (const fd_ops::OpError& e) {
    fd_ops::throw_paddle(e);
  }
}

PD_BUILD_OP(speculate_set_value_by_flags_and_idx)
    SPECULATE_SET_VALUE_BY_FLAGS_AND_IDX_SIGNATURE
    .SetKernelFn(PD_KERNEL(SpeculateSetValueByFlagsAndIdx));
