// speculate_update (OPS §5.1): fold this step's verification results into the per-slot sequence state and
// compute not_need_stop.
#include <algorithm>
#include <cstdint>
#include <string>

#include "kl3/context.h"
#include "kl3/host_access.h"
#include "kl3/wrapper_check.h"
#include "kl3_launch.h"
#include "xpu/plugin.h"

namespace fd_xpu {
namespace kernel {
// kernel/kunlun3cpp/mtp_kernel/speculate_update.xpu; launched <<<1, 64>>> (OPS §6.1).
KL3_KERNEL_DECL void speculate_update(int32_t* seq_lens_encoder, int32_t* seq_lens_decoder, bool* not_need_stop,
                                      kl3dev::int64* draft_tokens, int32_t* actual_draft_token_nums,
                                      const kl3dev::int64* accept_tokens, const int32_t* accept_num,
                                      const bool* stop_flags, const int32_t* seq_lens_this_time,
                                      const bool* is_block_step, int32_t* mask_rollback, int B, int R, int T);
}  // namespace kernel
}  // namespace fd_xpu

namespace fd_xpu {
namespace plugin {

static const char* const kl3_wrapper_op = "speculate_update";

// New actual_draft_token_nums value (OPS §5.1 step 1): grow by up to 2 when every draft was accepted, else
// shrink by 1; always within [1, T - 1] when the input is in the domain.
static int32_t adapted_draft_len(int64_t cur, int64_t n, int64_t T) {
  if (n - 1 == cur) {
    if (cur + 2 <= T - 1) return static_cast<int32_t>(cur + 2);
    if (cur + 1 <= T - 1) return static_cast<int32_t>(cur + 1);
    return static_cast<int32_t>(T - 1);
  }
  return static_cast<int32_t>(std::max<int64_t>(cur - 1, 1));
}

static int cpu_wrapper(kl3::Context* ctx, int32_t* seq_lens_encoder, int32_t* seq_lens_decoder,
                       bool* not_need_stop, int64_t* draft_tokens, int32_t* actual_draft_token_nums,
                       const int64_t* accept_tokens, const int32_t* accept_num, const bool* stop_flags,
                       const int32_t* seq_lens_this_time, const bool* is_block_step, int32_t* mask_rollback,
                       int B, int R, int T) {
  // Row A: padding slots b >= R are counted as stopped and never touched.
  int64_t stopped = B - R;
  for (int64_t b = 0; b < R; ++b) {
    if (kl3::read_flag(is_block_step, b)) {
      continue;  // row B: parked, not counted
    }
    // All reads are of the values at the start of the op (64-bit arithmetic; the int32 results wrap only
    // outside the value domain).
    const int64_t n = accept_num[b];
    const int64_t enc = seq_lens_encoder[b];
    const int64_t dec = seq_lens_decoder[b];
    const int64_t stlt = seq_lens_this_time[b];
    int64_t new_dec = dec;
    if (kl3::read_flag(stop_flags, b)) {  // row C: the stopping step's tokens still count as KV
      new_dec = dec + n;
      mask_rollback[b] = 0;
      ++stopped;
    } else if (enc == 0) {  // row D: decode
      new_dec = dec + n;
      mask_rollback[b] = static_cast<int32_t>(stlt - n);
    } else {  // row E: prefill chunk
      mask_rollback[b] = 0;
    }
    if (stlt > 1 && enc == 0) {
      actual_draft_token_nums[b] = adapted_draft_len(actual_draft_token_nums[b], n, T);
    }
    if (enc != 0) {
      new_dec += enc;
      seq_lens_encoder[b] = 0;
    }
    seq_lens_decoder[b] = static_cast<int32_t>(new_dec);
    // The seed reads accept_tokens only inside the slot's row (FastDeploy reads index -1 when n == 0).
    if (n >= 1 && n <= T) {
      draft_tokens[b * T] = accept_tokens[b * T + n - 1];
    }
  }
  not_need_stop[0] = stopped < B;
  return kl3::SUCCESS;
}

static int xpu3_wrapper(kl3::Context* ctx, int32_t* seq_lens_encoder, int32_t* seq_lens_decoder,
                        bool* not_need_stop, int64_t* draft_tokens, int32_t* actual_draft_token_nums,
                        const int64_t* accept_tokens, const int32_t* accept_num, const bool* stop_flags,
                        const int32_t* seq_lens_this_time, const bool* is_block_step, int32_t* mask_rollback,
                        int B, int R, int T) {
  // The kernel writes not_need_stop into a one-element device buffer; it is copied to the host tensor (OPS §6).
  bool* not_need_stop_dev = nullptr;
  if (kl3dev::alloc(reinterpret_cast<void**>(&not_need_stop_dev), sizeof(bool)) != 0) {
    return kl3::fail_op(kl3::RUNTIME_ERROR, kl3_wrapper_op, "cannot allocate the device copy of not_need_stop");
  }
  KL3_GM_TENSOR(seq_lens_encoder, B);
  KL3_GM_TENSOR(seq_lens_decoder, B);
  KL3_GM_TENSOR(not_need_stop_dev, 1);
  KL3_GM_TENSOR(draft_tokens, static_cast<int64_t>(B) * T);
  KL3_GM_TENSOR(actual_draft_token_nums, B);
  KL3_GM_TENSOR(accept_tokens, static_cast<int64_t>(B) * T);
  KL3_GM_TENSOR(accept_num, B);
  KL3_GM_TENSOR(stop_flags, B);
  KL3_GM_TENSOR(seq_lens_this_time, R);
  KL3_GM_TENSOR(is_block_step, B);
  KL3_GM_TENSOR(mask_rollback, B);
  int ret = KL3_LAUNCH(kernel::speculate_update, 1, 64, ctx->stream, seq_lens_encoder, seq_lens_decoder,
                       not_need_stop_dev, kl3dev::i64(draft_tokens), actual_draft_token_nums,
                       kl3dev::i64(accept_tokens), accept_num, stop_flags, seq_lens_this_time, is_block_step,
                       mask_rollback, B, R, T);
  if (ret == 0) {
    ret = kl3dev::copy_to_host(not_need_stop, not_need_stop_dev, sizeof(bool), ctx->stream);
  }
  kl3dev::release(not_need_stop_dev);
  if (ret != 0) {
    kl3::set_last_error(kl3dev::launch_error());
  }
  KERNEL_ASSERT_SUCCESS(ctx, ret);
  return kl3::SUCCESS;
}

int speculate_update(kl3::Context* ctx, int32_t* seq_lens_encoder, int32_t* seq_lens_decoder,
                     bool* not_need_stop, int64_t* draft_tokens, int32_t* actual_draft_token_nums,
                     const int64_t* accept_tokens, const int32_t* accept_num, const bool* stop_flags,
                     const int32_t* seq_lens_this_time, const bool* is_block_step, int32_t* mask_rollback,
                     int B, int R, int T) {
  WRAPPER_CHECK_CTX(ctx);
  WRAPPER_ASSERT_GE(ctx, "stop_flags", B, 1);
  WRAPPER_ASSERT_LE(ctx, "stop_flags", B, kSpeculateUpdateMaxSlots);
  WRAPPER_ASSERT_GE(ctx, "seq_lens_this_time", R, 1);
  WRAPPER_ASSERT_LE(ctx, "seq_lens_this_time", R, B);
  WRAPPER_ASSERT_GE(ctx, "draft_tokens", T, 1);
  const int64_t BT = static_cast<int64_t>(B) * T;
  WRAPPER_CHECK_PTR(ctx, int32_t, B, seq_lens_encoder);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, seq_lens_decoder);
  WRAPPER_CHECK_PTR(ctx, bool, 1, not_need_stop);
  WRAPPER_CHECK_PTR(ctx, int64_t, BT, draft_tokens);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, actual_draft_token_nums);
  WRAPPER_CHECK_PTR(ctx, int64_t, BT, accept_tokens);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, accept_num);
  WRAPPER_CHECK_PTR(ctx, bool, B, stop_flags);
  WRAPPER_CHECK_PTR(ctx, int32_t, R, seq_lens_this_time);
  WRAPPER_CHECK_PTR(ctx, bool, B, is_block_step);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, mask_rollback);
  if (ctx->type() == kl3::kCPU) {
    return cpu_wrapper(ctx, seq_lens_encoder, seq_lens_decoder, not_need_stop, draft_tokens,
                       actual_draft_token_nums, accept_tokens, accept_num, stop_flags, seq_lens_this_time,
                       is_block_step, mask_rollback, B, R, T);
  }
  if (ctx->type() == kl3::kXPU3) {
    return xpu3_wrapper(ctx, seq_lens_encoder, seq_lens_decoder, not_need_stop, draft_tokens,
                        actual_draft_token_nums, accept_tokens, accept_num, stop_flags, seq_lens_this_time,
                        is_block_step, mask_rollback, B, R, T);
  }
  WRAPPER_UNIMPLEMENTED(ctx);
}

}  // namespace plugin
}  // namespace fd_xpu
