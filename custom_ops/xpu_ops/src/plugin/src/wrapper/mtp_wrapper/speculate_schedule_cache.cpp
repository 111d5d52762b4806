// speculate_schedule_cache (OPS §5.4): end-of-step block management: stop unfinished prefill chunks, stop every
// slot after one step on a prefill instance, park decode slots without a KV block for their next step, and
// compute not_need_stop.
#include <cstdint>
#include <string>

#include "kl3/context.h"
#include "kl3/host_access.h"
#include "kl3/wrapper_check.h"
#include "kl3_launch.h"
#include "xpu/plugin.h"

namespace fd_xpu {
namespace kernel {
// kernel/kunlun3cpp/mtp_kernel/speculate_schedule_cache.xpu; launched <<<1, 64>>> (OPS §6.2).
KL3_KERNEL_DECL void speculate_schedule_cache(const kl3dev::int64* draft_tokens, const int32_t* block_tables,
                                              bool* stop_flags, const kl3dev::int64* prompt_lens,
                                              int32_t* seq_lens_this_time, int32_t* seq_lens_encoder,
                                              int32_t* seq_lens_decoder, int32_t* step_seq_lens_decoder,
                                              kl3dev::int64* step_draft_tokens, int32_t* step_seq_lens_this_time,
                                              int32_t* accept_num, kl3dev::int64* accept_tokens, bool* is_block_step,
                                              bool* not_need_stop, int B, int R, int T, int NB, int block_size,
                                              int max_draft_tokens, bool prefill_one_step_stop);
}  // namespace kernel
}  // namespace fd_xpu

namespace fd_xpu {
namespace plugin {

static const char* const kl3_wrapper_op = "speculate_schedule_cache";

static int cpu_wrapper(kl3::Context* ctx, const int64_t* draft_tokens, const int32_t* block_tables,
                       bool* stop_flags, const int64_t* prompt_lens, int32_t* seq_lens_this_time,
                       int32_t* seq_lens_encoder, int32_t* seq_lens_decoder, int32_t* step_seq_lens_decoder,
                       int64_t* step_draft_tokens, int32_t* step_seq_lens_this_time, int32_t* accept_num,
                       int64_t* accept_tokens, bool* is_block_step, bool* not_need_stop, int B, int R, int T,
                       int NB, int block_size, int max_draft_tokens, bool prefill_one_step_stop) {
  // Row Pad: padding slots b >= R are counted as stopped and never read.
  int64_t stopped = B - R;
  // Tokens the next step may need beyond the decoded length (one more than recover's 2K + 1, as in FastDeploy).
  const int64_t lookahead = 2 * static_cast<int64_t>(max_draft_tokens) + 2;
  for (int64_t b = 0; b < R; ++b) {
    if (kl3::read_flag(stop_flags, b)) {  // row Stp
      ++stopped;
      continue;
    }
    const int64_t dec = seq_lens_decoder[b];
    if (dec < prompt_lens[b] || prefill_one_step_stop) {  // rows Pre and One
      stop_flags[b] = true;
      seq_lens_this_time[b] = 0;
      seq_lens_decoder[b] = 0;
      seq_lens_encoder[b] = 0;
      accept_num[b] = 0;
      ++stopped;
      continue;
    }
    int64_t needed = dec + lookahead;
    if (needed < 0) {
      needed = 0;  // out of domain: keep the division non-negative (OPS §2.4)
    }
    const int64_t idx = needed / block_size;
    if (idx >= NB || block_tables[b * NB + idx] != -1) {
      continue;  // row Run (idx >= NB: not parked)
    }
    // Row Park, in the order of OPS §5.4: save what the next step would have consumed.
    is_block_step[b] = true;
    step_seq_lens_this_time[b] = seq_lens_this_time[b];
    seq_lens_this_time[b] = 0;
    stop_flags[b] = true;
    step_seq_lens_decoder[b] = seq_lens_decoder[b];
    seq_lens_decoder[b] = 0;
    accept_num[b] = 0;
    for (int64_t j = 0; j < T; ++j) {
      accept_tokens[b * T + j] = -1;
    }
    for (int64_t j = 0; j < T; ++j) {
      step_draft_tokens[b * T + j] = draft_tokens[b * T + j];
    }
    ++stopped;
  }
  not_need_stop[0] = stopped < B;
  return kl3::SUCCESS;
}

static int xpu3_wrapper(kl3::Context* ctx, const int64_t* draft_tokens, const int32_t* block_tables,
                        bool* stop_flags, const int64_t* prompt_lens, int32_t* seq_lens_this_time,
                        int32_t* seq_lens_encoder, int32_t* seq_lens_decoder, int32_t* step_seq_lens_decoder,
                        int64_t* step_draft_tokens, int32_t* step_seq_lens_this_time, int32_t* accept_num,
                        int64_t* accept_tokens, bool* is_block_step, bool* not_need_stop, int B, int R, int T,
                        int NB, int block_size, int max_draft_tokens, bool prefill_one_step_stop) {
  // The kernel writes not_need_stop into a one-element device buffer; it is copied to the host tensor (OPS §6).
  bool* not_need_stop_dev = nullptr;
  if (kl3dev::alloc(reinterpret_cast<void**>(&not_need_stop_dev), sizeof(bool)) != 0) {
    return kl3::fail_op(kl3::RUNTIME_ERROR, kl3_wrapper_op, "cannot allocate the device copy of not_need_stop");
  }
  KL3_GM_TENSOR(draft_tokens, static_cast<int64_t>(B) * T);
  KL3_GM_TENSOR(block_tables, static_cast<int64_t>(B) * NB);
  KL3_GM_TENSOR(stop_flags, B);
  KL3_GM_TENSOR(prompt_lens, B);
  KL3_GM_TENSOR(seq_lens_this_time, R);
  KL3_GM_TENSOR(seq_lens_encoder, B);
  KL3_GM_TENSOR(seq_lens_decoder, B);
  KL3_GM_TENSOR(step_seq_lens_decoder, B);
  KL3_GM_TENSOR(step_draft_tokens, static_cast<int64_t>(B) * T);
  KL3_GM_TENSOR(step_seq_lens_this_time, B);
  KL3_GM_TENSOR(accept_num, B);
  KL3_GM_TENSOR(accept_tokens, static_cast<int64_t>(B) * T);
  KL3_GM_TENSOR(is_block_step, B);
  KL3_GM_TENSOR(not_need_stop_dev, 1);
  int ret = KL3_LAUNCH(kernel::speculate_schedule_cache, 1, 64, ctx->stream, kl3dev::i64(draft_tokens), block_tables,
                       stop_flags, kl3dev::i64(prompt_lens), seq_lens_this_time, seq_lens_encoder, seq_lens_decoder,
                       step_seq_lens_decoder, kl3dev::i64(step_draft_tokens), step_seq_lens_this_time, accept_num,
                       kl3dev::i64(accept_tokens), is_block_step, not_need_stop_dev, B, R, T, NB, block_size,
                       max_draft_tokens, prefill_one_step_stop);
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

int speculate_schedule_cache(kl3::Context* ctx, const int64_t* draft_tokens, const int32_t* block_tables,
                             bool* stop_flags, const int64_t* prompt_lens, int32_t* seq_lens_this_time,
                             int32_t* seq_lens_encoder, int32_t* seq_lens_decoder, int32_t* step_seq_lens_decoder,
                             int64_t* step_draft_tokens, int32_t* step_seq_lens_this_time, int32_t* accept_num,
                             int64_t* accept_tokens, bool* is_block_step, bool* not_need_stop, int B, int R, int T,
                             int NB, int block_size, int max_draft_tokens, bool prefill_one_step_stop) {
  WRAPPER_CHECK_CTX(ctx);
  WRAPPER_ASSERT_GE(ctx, "stop_flags", B, 1);
  WRAPPER_ASSERT_GE(ctx, "seq_lens_this_time", R, 1);
  WRAPPER_ASSERT_LE(ctx, "seq_lens_this_time", R, B);
  WRAPPER_ASSERT_GE(ctx, "draft_tokens", T, 1);
  WRAPPER_ASSERT_GE(ctx, "block_tables", NB, 1);
  WRAPPER_ASSERT_GE(ctx, "block_size", block_size, 1);
  WRAPPER_ASSERT_GE(ctx, "max_draft_tokens", max_draft_tokens, 0);
  const int64_t BT = static_cast<int64_t>(B) * T;
  WRAPPER_CHECK_PTR(ctx, int64_t, BT, draft_tokens);
  WRAPPER_CHECK_PTR(ctx, int32_t, static_cast<int64_t>(B) * NB, block_tables);
  WRAPPER_CHECK_PTR(ctx, bool, B, stop_flags);
  WRAPPER_CHECK_PTR(ctx, int64_t, B, prompt_lens);
  WRAPPER_CHECK_PTR(ctx, int32_t, R, seq_lens_this_time);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, seq_lens_encoder);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, seq_lens_decoder);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, step_seq_lens_decoder);
  WRAPPER_CHECK_PTR(ctx, int64_t, BT, step_draft_tokens);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, step_seq_lens_this_time);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, accept_num);
  WRAPPER_CHECK_PTR(ctx, int64_t, BT, accept_tokens);
  WRAPPER_CHECK_PTR(ctx, bool, B, is_block_step);
  WRAPPER_CHECK_PTR(ctx, bool, 1, not_need_stop);
  if (ctx->type() == kl3::kCPU) {
    return cpu_wrapper(ctx, draft_tokens, block_tables, stop_flags, prompt_lens, seq_lens_this_time,
                       seq_lens_encoder, seq_lens_decoder, step_seq_lens_decoder, step_draft_tokens,
                       step_seq_lens_this_time, accept_num, accept_tokens, is_block_step, not_need_stop, B, R, T,
                       NB, block_size, max_draft_tokens, prefill_one_step_stop);
  }
  if (ctx->type() == kl3::kXPU3) {
    return xpu3_wrapper(ctx, draft_tokens, block_tables, stop_flags, prompt_lens, seq_lens_this_time,
                        seq_lens_encoder, seq_lens_decoder, step_seq_lens_decoder, step_draft_tokens,
                        step_seq_lens_this_time, accept_num, accept_tokens, is_block_step, not_need_stop, B, R, T,
                        NB, block_size, max_draft_tokens, prefill_one_step_stop);
  }
  WRAPPER_UNIMPLEMENTED(ctx);
}

}  // namespace plugin
}  // namespace fd_xpu
