// speculate_save_output (OPS §5.7): build the step message (per-slot counts and tokens). There is no kernel:
// the message is assembled on the host for every backend.
#include <cstdint>
#include <string>
#include <vector>

#include "kl3/context.h"
#include "kl3/host_access.h"
#include "kl3/wrapper_check.h"
#include "kl3_launch.h"
#include "xpu/plugin.h"

namespace fd_xpu {
namespace plugin {

static const char* const kl3_wrapper_op = "speculate_save_output";

// Step-message constants (OPS §1); fastdeploy.model_executor.ops.xpu exports the same values.
static const int64_t kMsgId = 1;
static const int64_t kPreemptedTokenId = -9;

// Host assembly over host-visible inputs (CPU tensors, or an emulated Kunlun3 context whose tensors are host
// memory).
static int cpu_wrapper(kl3::Context* ctx, const int64_t* accept_tokens, const int32_t* accept_num,
                       const bool* not_need_stop, const int32_t* seq_lens_decoder, const int64_t* prompt_lens,
                       int32_t* preempted_idx, int64_t* msg, int bsz, int T, int rank_id, bool save_each_rank,
                       bool skip_prefill) {
  if (!save_each_rank && rank_id > 0) {
    return kl3::SUCCESS;  // rule 1: this rank sends nothing; no side effects
  }
  msg[0] = kl3::read_flag(not_need_stop, 0) ? kMsgId : -kMsgId;
  msg[1] = bsz;
  int64_t* counts = msg + 2;
  int64_t* tokens = msg + 2 + bsz;
  for (int64_t j = 0; j < bsz; ++j) {
    int64_t count;
    if (preempted_idx[j] != 0) {
      count = kPreemptedTokenId;
      preempted_idx[j] = 0;  // reported exactly once
    } else if (skip_prefill && static_cast<int64_t>(seq_lens_decoder[j]) < prompt_lens[j]) {
      count = 0;  // unfinished prefill is hidden
    } else {
      count = accept_num[j];
    }
    counts[j] = count;
    // Tokens past the count are zeroed so that messages are canonical.
    for (int64_t k = 0; k < T; ++k) {
      tokens[j * T + k] = k < count ? accept_tokens[j * T + k] : 0;
    }
  }
  return kl3::SUCCESS;
}

// On a Kunlun3 device the inputs live in device memory: they are copied to host buffers first (explicit,
// synchronous device-to-host copies on the context's stream, OPS §5.7 "Implementation"), then assembled as on the
// host. not_need_stop and preempted_idx are host tensors on every backend (OPS §2.2). An emulated context's
// tensors are host memory already.
static int xpu3_wrapper(kl3::Context* ctx, const int64_t* accept_tokens, const int32_t* accept_num,
                        const bool* not_need_stop, const int32_t* seq_lens_decoder, const int64_t* prompt_lens,
                        int32_t* preempted_idx, int64_t* msg, int bsz, int T, int rank_id, bool save_each_rank,
                        bool skip_prefill) {
  if (ctx->emulated) {
    return cpu_wrapper(ctx, accept_tokens, accept_num, not_need_stop, seq_lens_decoder, prompt_lens,
                       preempted_idx, msg, bsz, T, rank_id, save_each_rank, skip_prefill);
  }
  if (!save_each_rank && rank_id > 0) {
    return kl3::SUCCESS;  // rule 1: nothing to copy or send
  }
  std::vector<int64_t> accept_tokens_host(static_cast<size_t>(bsz) * T);
  std::vector<int32_t> accept_num_host(bsz);
  std::vector<int32_t> seq_lens_decoder_host(bsz);
  std::vector<int64_t> prompt_lens_host(bsz);
  int ret = kl3dev::copy_to_host(accept_tokens_host.data(), accept_tokens, accept_tokens_host.size() * sizeof(int64_t),
                                 ctx->stream);
  if (ret == 0) {
    ret = kl3dev::copy_to_host(accept_num_host.data(), accept_num, accept_num_host.size() * sizeof(int32_t),
                               ctx->stream);
  }
  if (ret == 0) {
    ret = kl3dev::copy_to_host(seq_lens_decoder_host.data(), seq_lens_decoder,
                               seq_lens_decoder_host.size() * sizeof(int32_t), ctx->stream);
  }
  if (ret == 0) {
    ret = kl3dev::copy_to_host(prompt_lens_host.data(), prompt_lens, prompt_lens_host.size() * sizeof(int64_t),
                               ctx->stream);
  }
  if (ret != 0) {
    return kl3::fail_op(kl3::RUNTIME_ERROR, kl3_wrapper_op,
                        "device-to-host copy failed with status " + std::to_string(ret));
  }
  return cpu_wrapper(ctx, accept_tokens_host.data(), accept_num_host.data(), not_need_stop,
                     seq_lens_decoder_host.data(), prompt_lens_host.data(), preempted_idx, msg, bsz, T, rank_id,
                     save_each_rank, skip_prefill);
}

int speculate_save_output(kl3::Context* ctx, const int64_t* accept_tokens, const int32_t* accept_num,
                          const bool* not_need_stop, const int32_t* seq_lens_decoder, const int64_t* prompt_lens,
                          int32_t* preempted_idx, int64_t* msg, int bsz, int T, int rank_id, bool save_each_rank,
                          bool skip_prefill) {
  WRAPPER_CHECK_CTX(ctx);
  WRAPPER_ASSERT_GE(ctx, "accept_tokens", bsz, 1);
  WRAPPER_ASSERT_GE(ctx, "accept_tokens", T, 1);
  WRAPPER_ASSERT_GE(ctx, "rank_id", rank_id, 0);
  WRAPPER_CHECK_PTR(ctx, int64_t, static_cast<int64_t>(bsz) * T, accept_tokens);
  WRAPPER_CHECK_PTR(ctx, int32_t, bsz, accept_num);
  WRAPPER_CHECK_PTR(ctx, bool, 1, not_need_stop);
  WRAPPER_CHECK_PTR(ctx, int32_t, bsz, seq_lens_decoder);
  WRAPPER_CHECK_PTR(ctx, int64_t, bsz, prompt_lens);
  WRAPPER_CHECK_PTR(ctx, int32_t, bsz, preempted_idx);
  // An empty message (rule 1) may come with a null `msg`.
  const int64_t msg_numel = speculate_save_output_msg_numel(bsz, T, rank_id, save_each_rank);
  WRAPPER_CHECK_PTR(ctx, int64_t, msg_numel, msg);
  if (ctx->type() == kl3::kCPU) {
    return cpu_wrapper(ctx, accept_tokens, accept_num, not_need_stop, seq_lens_decoder, prompt_lens,
                       preempted_idx, msg, bsz, T, rank_id, save_each_rank, skip_prefill);
  }
  if (ctx->type() == kl3::kXPU3) {
    return xpu3_wrapper(ctx, accept_tokens, accept_num, not_need_stop, seq_lens_decoder, prompt_lens,
                        preempted_idx, msg, bsz, T, rank_id, save_each_rank, skip_prefill);
  }
  WRAPPER_UNIMPLEMENTED(ctx);
}

}  // namespace plugin
}  // namespace fd_xpu
