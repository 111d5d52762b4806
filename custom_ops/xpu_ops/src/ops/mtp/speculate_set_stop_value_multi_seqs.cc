// Paddle op speculate_set_stop_value_multi_seqs (OPS §5.3). In place: accept_tokens, accept_num, stop_flags.
#include "common/mtp_calls.h"
#include "mtp/op_signatures.h"
#include "mtp/paddle_args.h"

void SpeculateSetStopValueMultiSeqs(paddle::Tensor& accept_tokens,         // [B, T] int64
                                    paddle::Tensor& accept_num,            // [B] / [B, 1] int32
                                    const paddle::Tensor& pre_ids,         // [B, M] int64
                                    const paddle::Tensor& step_idx,        // [B] / [B, 1] int64
                                    paddle::Tensor& stop_flags,            // [B] / [B, 1] bool
                                    const paddle::Tensor& seq_lens,        // [R] / [R, 1] int32 (length only)
                                    const paddle::Tensor& stop_seqs,       // [B, S, SL] int64
                                    const paddle::Tensor& stop_seqs_len,   // [B, S] int32
                                    const paddle::Tensor& end_ids,         // [E] / [E, 1] int64
                                    const paddle::Tensor& min_tokens,      // [B] / [B, 1] int64
                                    int ncluster) {
  using fd_ops::to_arg;
  try {
    fd_ops::speculate_set_stop_value_multi_seqs(to_arg(accept_tokens), to_arg(accept_num), to_arg(pre_ids),
                                                to_arg(step_idx), to_arg(stop_flags), to_arg(seq_lens),
                                                to_arg(stop_seqs), to_arg(stop_seqs_len), to_arg(end_ids),
                                                to_arg(min_tokens), ncluster);
  } catch (const fd_ops::OpError& e) {
    fd_ops::throw_paddle(e);
  }
}

PD_BUILD_OP(speculate_set_stop_value_multi_seqs)
    SPECULATE_SET_STOP_VALUE_MULTI_SEQS_SIGNATURE
    .SetKernelFn(PD_KERNEL(SpeculateSetStopValueMultiSeqs));
