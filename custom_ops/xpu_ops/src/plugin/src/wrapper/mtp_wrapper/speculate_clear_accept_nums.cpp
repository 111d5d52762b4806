// speculate_clear_accept_nums (OPS §5.6): zero accept_num of every slot without valid KV.
#include <cstdint>
#include <string>

#include "kl3/context.h"
#include "kl3/wrapper_check.h"
#include "kl3_launch.h"
#include "xpu/plugin.h"

namespace fd_xpu {
namespace kernel {
// kernel/kunlun3cpp/mtp_kernel/speculate_clear_accept_nums.xpu; launched <<<1, 64>>> (OPS §6).
KL3_KERNEL_DECL void speculate_clear_accept_nums(int32_t* accept_num, const int32_t* seq_lens_decoder, int B);
}  // namespace kernel
}  // namespace fd_xpu

namespace fd_xpu {
namespace plugin {

static const char* const kl3_wrapper_op = "speculate_clear_accept_nums";

static int cpu_wrapper(kl3::Context* ctx, int32_t* accept_num, const int32_t* seq_lens_decoder, int B) {
  for (int64_t b = 0; b < B; ++b) {
    if (seq_lens_decoder[b] == 0) {
      accept_num[b] = 0;
    }
  }
  return kl3::SUCCESS;
}

static int xpu3_wrapper(kl3::Context* ctx, int32_t* accept_num, const int32_t* seq_lens_decoder, int B) {
  KL3_GM_TENSOR(accept_num, B);
  KL3_GM_TENSOR(seq_lens_decoder, B);
  int ret = KL3_LAUNCH(kernel::speculate_clear_accept_nums, 1, 64, ctx->stream, accept_num, seq_lens_decoder, B);
  if (ret != 0) {
    kl3::set_last_error(kl3dev::launch_error());
  }
  KERNEL_ASSERT_SUCCESS(ctx, ret);
  return kl3::SUCCESS;
}

int speculate_clear_accept_nums(kl3::Context* ctx, int32_t* accept_num, const int32_t* seq_lens_decoder, int B) {
  WRAPPER_CHECK_CTX(ctx);
  WRAPPER_ASSERT_GE(ctx, "accept_num", B, 1);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, accept_num);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, seq_lens_decoder);
  if (ctx->type() == kl3::kCPU) {
    return cpu_wrapper(ctx, accept_num, seq_lens_decoder, B);
  }
  if (ctx->type() == kl3::kXPU3) {
    return xpu3_wrapper(ctx, accept_num, seq_lens_decoder, B);
  }
  WRAPPER_UNIMPLEMENTED(ctx);
}

}  // namespace plugin
}  // namespace fd_xpu
