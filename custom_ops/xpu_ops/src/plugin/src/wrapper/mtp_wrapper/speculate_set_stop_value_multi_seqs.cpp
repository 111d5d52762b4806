// speculate_set_stop_value_multi_seqs (OPS §5.3): per-request stop-sequence matching over this step's accepted
// tokens and the generated history; the first match truncates the run and stops the slot.
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
// kernel/kunlun3cpp/mtp_kernel/speculate_set_stop_value_multi_seqs.xpu; launched <<<ncluster, 64>>> (OPS §6).
KL3_KERNEL_DECL void speculate_set_stop_value_multi_seqs(kl3dev::int64* accept_tokens, int32_t* accept_num,
                                                         const kl3dev::int64* pre_ids, const kl3dev::int64* step_idx,
                                                         bool* stop_flags, const kl3dev::int64* stop_seqs,
                                                         const int32_t* stop_seqs_len, const kl3dev::int64* end_ids,
                                                         const kl3dev::int64* min_tokens, int R, int T, int M, int S,
                                                         int SL);
}  // namespace kernel
}  // namespace fd_xpu

namespace fd_xpu {
namespace plugin {

static const char* const kl3_wrapper_op = "speculate_set_stop_value_multi_seqs";

// Match test of OPS §5.3 for one slot row: does stop sequence `seq` (length `len`) end immediately before accept
// position `a`? Tokens before the accepted run come from the history; a window needing generated token 0 (or an
// index outside the row) never matches.
static bool stop_seq_matches(const int64_t* accept_row, const int64_t* pre_ids_row, const int64_t* seq, int64_t len,
                             int64_t SL, int64_t s, int64_t n, int64_t a, int64_t M) {
  if (len <= 0 || len > SL) {
    return false;  // unused entry / out-of-domain guard
  }
  if (s - n + a + 1 < len) {
    return false;  // not enough generated history
  }
  for (int64_t k = 0; k < len; ++k) {
    const int64_t expected = seq[len - 1 - k];
    const int64_t p = a - 1 - k;
    int64_t actual;
    if (p >= 0) {
      actual = accept_row[p];
    } else {
      const int64_t m = s - n + a - k;
      if (m <= 0 || m >= M) {
        return false;
      }
      actual = pre_ids_row[m];
    }
    if (actual != expected) {
      return false;
    }
  }
  return true;
}

static int cpu_wrapper(kl3::Context* ctx, int64_t* accept_tokens, int32_t* accept_num, const int64_t* pre_ids,
                       const int64_t* step_idx, bool* stop_flags, const int64_t* stop_seqs,
                       const int32_t* stop_seqs_len, const int64_t* end_ids, const int64_t* min_tokens, int B,
                       int R, int T, int M, int S, int SL) {
  for (int64_t b = 0; b < R; ++b) {
    const int64_t s = step_idx[b];
    const int64_t n = accept_num[b];
    // n <= 0: nothing produced this step. A slot verify stopped in this step (n >= 1) is still scanned.
    if (n <= 0) {
      continue;
    }
    const int64_t* accept_row = accept_tokens + b * T;
    const int64_t* pre_ids_row = pre_ids + b * M;
    const int64_t positions = std::min<int64_t>(n, T);
    // Position-major: the earliest eligible position with any matching sequence wins.
    for (int64_t a = 0; a < positions; ++a) {
      if (s - n + a + 1 < min_tokens[b]) {
        continue;  // per-position min_tokens gate
      }
      bool matched = false;
      for (int64_t t = 0; t < S && !matched; ++t) {
        const int64_t row = b * S + t;
        matched = stop_seq_matches(accept_row, pre_ids_row, stop_seqs + row * SL, stop_seqs_len[row], SL, s, n,
                                   a, M);
      }
      if (matched) {
        accept_num[b] = static_cast<int32_t>(a + 1);
        accept_tokens[b * T + a] = end_ids[0];
        stop_flags[b] = true;
        break;
      }
    }
  }
  return kl3::SUCCESS;
}

static int xpu3_wrapper(kl3::Context* ctx, int64_t* accept_tokens, int32_t* accept_num, const int64_t* pre_ids,
                        const int64_t* step_idx, bool* stop_flags, const int64_t* stop_seqs,
                        const int32_t* stop_seqs_len, const int64_t* end_ids, const int64_t* min_tokens, int B,
                        int R, int T, int M, int S, int SL) {
  KL3_GM_TENSOR(accept_tokens, static_cast<int64_t>(B) * T);
  KL3_GM_TENSOR(accept_num, B);
  KL3_GM_TENSOR(pre_ids, static_cast<int64_t>(B) * M);
  KL3_GM_TENSOR(step_idx, B);
  KL3_GM_TENSOR(stop_flags, B);
  KL3_GM_TENSOR(stop_seqs, static_cast<int64_t>(B) * S * SL);
  KL3_GM_TENSOR(stop_seqs_len, static_cast<int64_t>(B) * S);
  KL3_GM_TENSOR(end_ids, 1);
  KL3_GM_TENSOR(min_tokens, B);
  int ret = KL3_LAUNCH(kernel::speculate_set_stop_value_multi_seqs, ctx->ncluster, 64, ctx->stream,
                       kl3dev::i64(accept_tokens), accept_num, kl3dev::i64(pre_ids), kl3dev::i64(step_idx),
                       stop_flags, kl3dev::i64(stop_seqs), stop_seqs_len, kl3dev::i64(end_ids),
                       kl3dev::i64(min_tokens), R, T, M, S, SL);
  if (ret != 0) {
    kl3::set_last_error(kl3dev::launch_error());
  }
  KERNEL_ASSERT_SUCCESS(ctx, ret);
  return kl3::SUCCESS;
}

int speculate_set_stop_value_multi_seqs(kl3::Context* ctx, int64_t* accept_tokens, int32_t* accept_num,
                                        const int64_t* pre_ids, const int64_t* step_idx, bool* stop_flags,
                                        const int32_t* seq_lens, const int64_t* stop_seqs,
                                        const int32_t* stop_seqs_len, const int64_t* end_ids,
                                        const int64_t* min_tokens, int B, int R, int T, int M, int S, int SL,
                                        int E) {
  WRAPPER_CHECK_CTX(ctx);
  WRAPPER_ASSERT_GE(ctx, "stop_flags", B, 1);
  WRAPPER_ASSERT_GE(ctx, "seq_lens", R, 1);
  WRAPPER_ASSERT_LE(ctx, "seq_lens", R, B);
  WRAPPER_ASSERT_GE(ctx, "accept_tokens", T, 1);
  WRAPPER_ASSERT_GE(ctx, "pre_ids", M, 1);
  WRAPPER_ASSERT_GE(ctx, "stop_seqs", S, 1);
  WRAPPER_ASSERT_GE(ctx, "stop_seqs", SL, 1);
  WRAPPER_ASSERT_GE(ctx, "end_ids", E, 1);
  WRAPPER_CHECK_PTR(ctx, int64_t, static_cast<int64_t>(B) * T, accept_tokens);
  WRAPPER_CHECK_PTR(ctx, int32_t, B, accept_num);
  WRAPPER_CHECK_PTR(ctx, int64_t, static_cast<int64_t>(B) * M, pre_ids);
  WRAPPER_CHECK_PTR(ctx, int64_t, B, step_idx);
  WRAPPER_CHECK_PTR(ctx, bool, B, stop_flags);
  WRAPPER_CHECK_PTR(ctx, int32_t, R, seq_lens);
  WRAPPER_CHECK_PTR(ctx, int64_t, static_cast<int64_t>(B) * S * SL, stop_seqs);
  WRAPPER_CHECK_PTR(ctx, int32_t, static_cast<int64_t>(B) * S, stop_seqs_len);
  WRAPPER_CHECK_PTR(ctx, int64_t, E, end_ids);
  WRAPPER_CHECK_PTR(ctx, int64_t, B, min_tokens);
  if (ctx->type() == kl3::kCPU) {
    return cpu_wrapper(ctx, accept_tokens, accept_num, pre_ids, step_idx, stop_flags, stop_seqs, stop_seqs_len,
                       end_ids, min_tokens, B, R, T, M, S, SL);
  }
  if (ctx->type() == kl3::kXPU3) {
    return xpu3_wrapper(ctx, accept_tokens, accept_num, pre_ids, step_idx, stop_flags, stop_seqs, stop_seqs_len,
                        end_ids, min_tokens, B, R, T, M, S, SL);
  }
  WRAPPER_UNIMPLEMENTED(ctx);
}

}  // namespace plugin
}  // namespace fd_xpu
