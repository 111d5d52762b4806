// Framework-neutral entry of each speculative-decoding op: validate every argument (before any side effect),
// derive the dimensions from the shapes, build the kl3 context from `ncluster`, call the plugin. Failures throw
// fd_ops::OpError. The Paddle ops (ops/mtp/*.cc) and the pybind11 module (ops/pybind/pybind.cc) are thin
// adapters over these functions. Arguments are in OPS.md order.
#pragma once

#include <cstdint>

#include "common/op_args.h"

namespace fd_ops {

void speculate_update(const TensorArg& seq_lens_encoder, const TensorArg& seq_lens_decoder,
                      const TensorArg& not_need_stop, const TensorArg& draft_tokens,
                      const TensorArg& actual_draft_token_nums, const TensorArg& accept_tokens,
                      const TensorArg& accept_num, const TensorArg& stop_flags, const TensorArg& seq_lens_this_time,
                      const TensorArg& is_block_step, const TensorArg& mask_rollback, int ncluster);

void speculate_set_value_by_flags_and_idx(const TensorArg& pre_ids_all, const TensorArg& accept_tokens,
                                          const TensorArg& accept_num, const TensorArg& stop_flags,
                                          const TensorArg& seq_lens_this_time, const TensorArg& seq_lens_encoder,
                                          const TensorArg& seq_lens_decoder, const TensorArg& step_idx,
                                          int ncluster);

void speculate_set_stop_value_multi_seqs(const TensorArg& accept_tokens, const TensorArg& accept_num,
                                         const TensorArg& pre_ids, const TensorArg& step_idx,
                                         const TensorArg& stop_flags, const TensorArg& seq_lens,
                                         const TensorArg& stop_seqs, const TensorArg& stop_seqs_len,
                                         const TensorArg& end_ids, const TensorArg& min_tokens, int ncluster);

void speculate_schedule_cache(const TensorArg& draft_tokens, const TensorArg& block_tables,
                              const TensorArg& stop_flags, const TensorArg& prompt_lens,
                              const TensorArg& seq_lens_this_time, const TensorArg& seq_lens_encoder,
                              const TensorArg& seq_lens_decoder, const TensorArg& step_seq_lens_decoder,
                              const TensorArg& step_draft_tokens, const TensorArg& step_seq_lens_this_time,
                              const TensorArg& accept_num, const TensorArg& accept_tokens,
                              const TensorArg& is_block_step, const TensorArg& not_need_stop, int block_size,
                              int max_draft_tokens, bool prefill_one_step_stop, int ncluster);

// The last three tensors are optional (present == false): all given = speculative, none = non-speculative.
void recover_decode_task(const TensorArg& stop_flags, const TensorArg& seq_lens_this_time,
                         const TensorArg& seq_lens_encoder, const TensorArg& seq_lens_decoder,
                         const TensorArg& step_seq_lens_decoder, const TensorArg& block_tables,
                         const TensorArg& is_block_step, const TensorArg& draft_tokens,
                         const TensorArg& step_draft_tokens, const TensorArg& step_seq_lens_this_time,
                         int block_size, int max_draft_tokens, int ncluster);

void speculate_clear_accept_nums(const TensorArg& accept_num, const TensorArg& seq_lens_decoder, int ncluster);

// Allocates the host int64 message of `numel` elements (numel may be 0) and returns its data pointer.
using MsgAllocator = int64_t* (*)(int64_t numel, void* user);

// Calls `alloc_msg` once, after validation, then fills the message (OPS §5.7).
void speculate_save_output(const TensorArg& accept_tokens, const TensorArg& accept_num,
                           const TensorArg& not_need_stop, const TensorArg& seq_lens_decoder,
                           const TensorArg& prompt_lens, const TensorArg& preempted_idx, int rank_id,
                           bool save_each_rank, bool skip_prefill, int ncluster, MsgAllocator alloc_msg, void* user);

}  // namespace fd_ops
