// Paddle op speculate_clear_accept_nums (OPS §5.6). In place: accept_num.
#include "common/mtp_calls.h"
#include "mtp/op_signatures.h"
#include "mtp/paddle_args.h"

void SpeculateClearAcceptNums(paddle::Tensor& accept_num,             // [B] / [B, 1] int32
                              const paddle::Tensor& seq_lens_decoder, // [B] / [B, 1] int32
                              int ncluster) {
  try {
    fd_ops::speculate_clear_accept_nums(fd_ops::to_arg(accept_num), fd_ops::to_arg(seq_lens_decoder), ncluster);
  } catch (const fd_ops::OpError& e) {
    fd_ops::throw_paddle(e);
  }
}

PD_BUILD_OP(speculate_clear_accept_nums)
    SPECULATE_CLEAR_ACCEPT_NUMS_SIGNATURE
    .SetKernelFn(PD_KERNEL(SpeculateClearAcceptNums));
