// speculate_set_value_by_flags_and_idx (OPS §5.2): clean up stopped slots and append this step's accepted
// tokens to each running slot's generated-token history pre_ids_all.
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
// kernel/kunlun3cpp/mtp_kernel/speculate_set_value_by_flags.xpu; launched <<<ncluster, 64>>> (OPS §6).
KL3_KERNEL_DECL void speculate_set_value_by_flags_and_idx(kl3dev::int64* pre_ids_all,
                                                          const kl3dev::int64* accept_tokens, int32_t* accept_num,
                                                          const bool* stop_flags, const int32_t* seq_lens_encoder,
                                                          int32_t* seq_lens_decoder, const kl3dev::int64* step_idx,
                                                          int R, int M, int T);
}  // namespace kernel
}  // namespace fd_xpu

namespace fd_xpu {
namespace plugin {

static const char* const kl3_wrapper_op = "speculate_set_value_by_flags_and_idx";

static int cpu_wrapper(kl3::Context* ctx, int64_t* pre_ids_all, const int64_t* accept_tokens,
                       int32_t* accept_num, const bool* stop_flags, const int32_t* seq_lens_encoder,
                       int32_t* seq_lens_decoder, const int64_t* step_idx, int B, int R, int M, int T) {
  // Slots b >= R are untouched; seq_lens_this_time contributes its length R only.
  for (int64_t b = 0; b < R; ++b) {
    if (kl3::read_flag(stop_flags, b)) {  // row S
      accept_num[b] = 0;
      seq_lens_decoder[b] = 0;
      continue;
    }
    if (seq_lens_encoder[b] == 0 && seq_lens_decoder[b] == 0) {
      continue;  // row Z
    }
    const int64_t s = step_idx[b];  // row W
    if (s <= 0) {
      continue;
    }
    const int64_t n = accept_num[b];
    const int64_t count = std::min<int64_t>(n, T);
    // Per-element guarded writes: the last accepted token lands at index s, and an index outside the row is
    // skipped (FastDeploy's window write starts before the row when s < T - 1).
    for (int64_t a = 0; a < count; ++a) {
      const int64_t idx = s - (n - 1 - a);
      if (idx >= 0 && idx < M) {
        pre_ids_all[b * M + idx] = accept_tokens[b * T + a];
      }
    }
  }
  return kl3::SUCCESS;
}

static int xpu3_wrapper(kl3::Context* ctx, int64_t* pre_ids_all, const int64_t* accept_tokens,
                        int32_t* accept_num, const bool* stop_flags, const int32_t* seq_lens_encoder,
                        int32_t* seq_lens_decoder, const int64_t* step_idx, int B, int R, int M, int T) {
  KL3_GM_TENSOR(pre_ids_all, static_cast<int64_t>(B) * M);
  KL3_GM_TENSOR(accept_tokens, static_cast<int64_t>(B) * T);
  KL3_GM_TENSOR(accept_num, B);
  KL3_GM_TENSOR(stop_flags, B);
  KL3_GM_TENSOR(seq_lens_encoder, B);
  KL3_GM_TENSOR(seq_lens_decoder, B);
  KL3_GM_TENSOR(step_idx, B);
  int ret = KL3_LAUNCH(kernel::speculate_set_value_by_flags_and_idx, ctx->ncluster, 64, ctx->stream,
                       kl3dev::i64(pre_ids_all), kl3dev::i64(accept_tokens), accept_num, stop_flags, seq_lens_encoder,
                       seq_lens_decoder, kl3dev::i64(step_idx), R, M, T);
  if (ret != 0) {
    kl3::set_last_error(kl3dev::launch_error());
  }
  KERNEL_ASSERT_SUCCESS(ctx, ret);
  return kl3::SUCCESS;
}

int speculate_set_value_by_flags_and_idx(kl3::Context* ctx, int64_t* pre_ids_all, const int64_t* accept_tokens,
                                         int32_t* accept_num, const bool* stop_flags,
                                         const int32_t* seq_lens_this_time, const int32_t* seq_lens_encoder,
                                         int32_t* seq_lens_decoder, const int64_t* step_idx, int B, int R, int M,
                                         int T) {
  WRAPPER_CHECK_CTX(ctx);
  WRAPPER_ASSERT_GE(ctx, "stop_flags", B, 1);
  WRAPPER_ASSERT_GE(ctx, "seq_lens_this_time", R, 1);
  WRAPPER_ASSERT_LE(ctx, "seq_lens_this_time", R, B);
  WRAPPER_ASSERT_GE(ctx, "pre_ids_all", M, 1);
  WRAPPER_ASSERT_GE(ctx, "accept_tokens", T, 1);
  WRAPPER_CHECK_PTR(ctx, int64_t, static_cast<int64_t>(B) * M, pre_ids_all);
  WRAPPER_CHECK_PTR(ctx, int64_t, static_cast<int64_t>(B) * T, accept_tokens);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, accept_num);
  WRAPPER_CHECK_PTR(ctx, bool, B, stop_flags);
  WRAPPER_CHECK_PTR(ctx, int32_t, R, seq_lens_this_time);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, seq_lens_encoder);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, seq_lens_decoder);
  WRAPPER_CHECK_PTR(ctx, int64_t, B, step_idx);
  if (ctx->type() == kl3::kCPU) {
    return cpu_wrapper(ctx, pre_ids_all, accept_tokens, accept_num, stop_flags, seq_lens_encoder,
                       seq_lens_decoder, step_idx, B, R, M, T);
  }
  if (ctx->type() == kl3::kXPU3) {
    return xpu3_wrapper(ctx, pre_ids_all, accept_tokens, accept_num, stop_flags, seq_lens_encoder,
                        seq_lens_decoder, step_idx, B, R, M, T);
  }
  WRAPPER_UNIMPLEMENTED(ctx);
}

}  // namespace plugin
}  // namespace fd_xpu
