// recover_decode_task (OPS §5.5): resume parked slots whose block table now has the block they need, restoring
// the state speculate_schedule_cache saved. Speculative when the draft tensors are given.
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
// kernel/kunlun3cpp/mtp_kernel/recover_spec_decode_task.xpu; launched <<<ncluster, 64>>> (OPS §6).
KL3_KERNEL_DECL void recover_spec_decode_task(bool* stop_flags, int32_t* seq_lens_this_time,
                                              int32_t* seq_lens_encoder, int32_t* seq_lens_decoder,
                                              const int32_t* step_seq_lens_decoder, const int32_t* block_tables,
                                              bool* is_block_step, kl3dev::int64* draft_tokens,
                                              const kl3dev::int64* step_draft_tokens,
                                              const int32_t* step_seq_lens_this_time, int R, int NB, int T,
                                              int block_size, int max_draft_tokens);
// kernel/kunlun3cpp/mtp_kernel/recover_decode_task.xpu (non-speculative); launched <<<ncluster, 64>>> (OPS §6).
KL3_KERNEL_DECL void recover_decode_task(bool* stop_flags, int32_t* seq_lens_this_time, int32_t* seq_lens_encoder,
                                         int32_t* seq_lens_decoder, const int32_t* step_seq_lens_decoder,
                                         const int32_t* block_tables, bool* is_block_step, int R, int NB,
                                         int block_size);
}  // namespace kernel
}  // namespace fd_xpu

namespace fd_xpu {
namespace plugin {

static const char* const kl3_wrapper_op = "recover_decode_task";

static int cpu_wrapper(kl3::Context* ctx, bool* stop_flags, int32_t* seq_lens_this_time, int32_t* seq_lens_encoder,
                       int32_t* seq_lens_decoder, const int32_t* step_seq_lens_decoder, const int32_t* block_tables,
                       bool* is_block_step, int64_t* draft_tokens, const int64_t* step_draft_tokens,
                       const int32_t* step_seq_lens_this_time, int B, int R, int NB, int T, int block_size,
                       int max_draft_tokens) {
  const bool speculative = draft_tokens != nullptr;
  const int64_t extra = speculative ? 2 * static_cast<int64_t>(max_draft_tokens) + 1 : 0;
  for (int64_t b = 0; b < R; ++b) {
    if (!kl3::read_flag(is_block_step, b)) {
      continue;
    }
    const int64_t saved_dec = step_seq_lens_decoder[b];
    // Clamped to the last column of the slot's own row: the next row is never read.
    const int64_t idx = std::min<int64_t>(std::max<int64_t>(saved_dec + extra, 0) / block_size, NB - 1);
    if (block_tables[b * NB + idx] == -1) {
      continue;  // still no block: stays parked
    }
    is_block_step[b] = false;
    stop_flags[b] = false;
    seq_lens_encoder[b] = 0;
    seq_lens_decoder[b] = static_cast<int32_t>(saved_dec);
    if (speculative) {
      const int32_t stlt = step_seq_lens_this_time[b];
      seq_lens_this_time[b] = stlt;
      const int64_t count = std::min<int64_t>(std::max<int64_t>(stlt, 0), T);
      for (int64_t j = 0; j < count; ++j) {
        draft_tokens[b * T + j] = step_draft_tokens[b * T + j];
      }
    } else {
      seq_lens_this_time[b] = 1;
    }
  }
  return kl3::SUCCESS;
}

static int xpu3_wrapper(kl3::Context* ctx, bool* stop_flags, int32_t* seq_lens_this_time, int32_t* seq_lens_encoder,
                        int32_t* seq_lens_decoder, const int32_t* step_seq_lens_decoder,
                        const int32_t* block_tables, bool* is_block_step, int64_t* draft_tokens,
                        const int64_t* step_draft_tokens, const int32_t* step_seq_lens_this_time, int B, int R,
                        int NB, int T, int block_size, int max_draft_tokens) {
  KL3_GM_TENSOR(stop_flags, B);
  KL3_GM_TENSOR(seq_lens_this_time, R);
  KL3_GM_TENSOR(seq_lens_encoder, B);
  KL3_GM_TENSOR(seq_lens_decoder, B);
  KL3_GM_TENSOR(step_seq_lens_decoder, B);
  KL3_GM_TENSOR(block_tables, static_cast<int64_t>(B) * NB);
  KL3_GM_TENSOR(is_block_step, B);
  int ret = 0;
  if (draft_tokens != nullptr) {
    KL3_GM_TENSOR(draft_tokens, static_cast<int64_t>(B) * T);
    KL3_GM_TENSOR(step_draft_tokens, static_cast<int64_t>(B) * T);
    KL3_GM_TENSOR(step_seq_lens_this_time, B);
    ret = KL3_LAUNCH(kernel::recover_spec_decode_task, ctx->ncluster, 64, ctx->stream, stop_flags, seq_lens_this_time,
                     seq_lens_encoder, seq_lens_decoder, step_seq_lens_decoder, block_tables, is_block_step,
                     kl3dev::i64(draft_tokens), kl3dev::i64(step_draft_tokens), step_seq_lens_this_time, R, NB, T,
                     block_size, max_draft_tokens);
  } else {
    ret = KL3_LAUNCH(kernel::recover_decode_task, ctx->ncluster, 64, ctx->stream, stop_flags, seq_lens_this_time,
                     seq_lens_encoder, seq_lens_decoder, step_seq_lens_decoder, block_tables, is_block_step, R, NB,
                     block_size);
  }
  if (ret != 0) {
    kl3::set_last_error(kl3dev::launch_error());
  }
  KERNEL_ASSERT_SUCCESS(ctx, ret);
  return kl3::SUCCESS;
}

int recover_decode_task(kl3::Context* ctx, bool* stop_flags, int32_t* seq_lens_this_time, int32_t* seq_lens_encoder,
                        int32_t* seq_lens_decoder, const int32_t* step_seq_lens_decoder, const int32_t* block_tables,
                        bool* is_block_step, int64_t* draft_tokens, const int64_t* step_draft_tokens,
                        const int32_t* step_seq_lens_this_time, int B, int R, int NB, int T, int block_size,
                        int max_draft_tokens) {
  WRAPPER_CHECK_CTX(ctx);
  // The three speculative tensors come together; report the first missing one.
  const bool any_spec = draft_tokens != nullptr || step_draft_tokens != nullptr || step_seq_lens_this_time != nullptr;
  if (any_spec) {
    const char* missing = draft_tokens == nullptr        ? "draft_tokens"
                          : step_draft_tokens == nullptr ? "step_draft_tokens"
                          : step_seq_lens_this_time == nullptr ? "step_seq_lens_this_time"
                                                               : nullptr;
    if (missing != nullptr) {
      return kl3::fail(kl3::INVALID_PARAM, kl3_wrapper_op, missing,
                       "the speculative tensors draft_tokens, step_draft_tokens and step_seq_lens_this_time must "
                       "be given together");
    }
    WRAPPER_ASSERT_GE(ctx, "draft_tokens", T, 1);
  }
  WRAPPER_ASSERT_GE(ctx, "stop_flags", B, 1);
  WRAPPER_ASSERT_GE(ctx, "seq_lens_this_time", R, 1);
  WRAPPER_ASSERT_LE(ctx, "seq_lens_this_time", R, B);
  WRAPPER_ASSERT_GE(ctx, "block_tables", NB, 1);
  WRAPPER_ASSERT_GE(ctx, "block_size", block_size, 1);
  WRAPPER_ASSERT_GE(ctx, "max_draft_tokens", max_draft_tokens, 0);
  WRAPPER_CHECK_PTR(ctx, bool, B, stop_flags);
  WRAPPER_CHECK_PTR(ctx, int32_t, R, seq_lens_this_time);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, seq_lens_encoder);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, seq_lens_decoder);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, step_seq_lens_decoder);
  WRAPPER_CHECK_PTR(ctx, int32_t, static_cast<int64_t>(B) * NB, block_tables);
  WRAPPER_CHECK_PTR(ctx, bool, B, is_block_step);
  if (any_spec) {
    WRAPPER_CHECK_PTR(ctx, int64_t, static_cast<int64_t>(B) * T, draft_tokens);
    WRAPPER_CHECK_PTR(ctx, int64_t, static_cast<int64_t>(B) * T, step_draft_tokens);
    WRAPPER_CHECK_PTR(ctx, int32_t, B, step_seq_lens_this_time);
  }
  if (ctx->type() == kl3::kCPU) {
    return cpu_wrapper(ctx, stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder,
                       step_seq_lens_decoder, block_tables, is_block_step, draft_tokens, step_draft_tokens,
                       step_seq_lens_this_time, B, R, NB, T, block_size, max_draft_tokens);
  }
  if (ctx->type() == kl3::kXPU3) {
    return xpu3_wrapper(ctx, stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder,
                        step_seq_lens_decoder, block_tables, is_block_step, draft_tokens, step_draft_tokens,
                        step_seq_lens_this_time, B, R, NB, T, block_size, max_draft_tokens);
  }
  WRAPPER_UNIMPLEMENTED(ctx);
}

}  // namespace plugin
}  // namespace fd_xpu
