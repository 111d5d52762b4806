// Public plugin API: one function per speculative-decoding state op (OPS.md §5).
//
// Every function: `int op(kl3::Context* ctx, <tensors in OPS.md order, const when read-only>, <derived dims>,
// <attributes>)`. It returns a kl3::Status; on failure kl3::last_error() holds "<op>: argument '<arg>': <what>".
// Per-slot tensors are flat: `[B]` and `[B, 1]` are the same buffer. Token rows are row-major `[B, T]`.
// The context selects the CPU path (kCPU) or the Kunlun3 kernel (kXPU3, real or emulated).
//
// C++11 (the vendor toolchain compiles wrappers with -std=c++11).
#pragma once

#include <cstdint>

#include "kl3/context.h"

namespace fd_xpu {
namespace plugin {

// OPS §5.1. B = numel(stop_flags) <= 512, R = numel(seq_lens_this_time) in [1, B], T = draft_tokens.shape[1].
int speculate_update(kl3::Context* ctx,
                     int32_t* seq_lens_encoder,         // [B]
                     int32_t* seq_lens_decoder,         // [B]
                     bool* not_need_stop,               // [1] host
                     int64_t* draft_tokens,             // [B, T] (column 0 written)
                     int32_t* actual_draft_token_nums,  // [B]
                     const int64_t* accept_tokens,      // [B, T]
                     const int32_t* accept_num,         // [B]
                     const bool* stop_flags,            // [B]
                     const int32_t* seq_lens_this_time, // [R]
                     const bool* is_block_step,         // [B]
                     int32_t* mask_rollback,            // [B]
                     int B, int R, int T);

// Most slots speculate_update accepts (its kernel stages per-slot state in 512-entry shared arrays, OPS §6.1).
const int kSpeculateUpdateMaxSlots = 512;

// OPS §5.2. seq_lens_this_time is read for its length R only.
int speculate_set_value_by_flags_and_idx(kl3::Context* ctx,
                                         int64_t* pre_ids_all,              // [B, M]
                                         const int64_t* accept_tokens,      // [B, T]
                                         int32_t* accept_num,               // [B]
                                         const bool* stop_flags,            // [B]
                                         const int32_t* seq_lens_this_time, // [R]
                                         const int32_t* seq_lens_encoder,   // [B]
                                         int32_t* seq_lens_decoder,         // [B]
                                         const int64_t* step_idx,           // [B]
                                         int B, int R, int M, int T);

// OPS §5.3. seq_lens is read for its length R only; end_ids has E >= 1 elements (element 0 is used).
int speculate_set_stop_value_multi_seqs(kl3::Context* ctx,
                                        int64_t* accept_tokens,        // [B, T]
                                        int32_t* accept_num,           // [B]
                                        const int64_t* pre_ids,        // [B, M]
                                        const int64_t* step_idx,       // [B]
                                        bool* stop_flags,              // [B]
                                        const int32_t* seq_lens,       // [R]
                                        const int64_t* stop_seqs,      // [B, S, SL]
                                        const int32_t* stop_seqs_len,  // [B, S]
                                        const int64_t* end_ids,        // [E]
                                        const int64_t* min_tokens,     // [B]
                                        int B, int R, int T, int M, int S, int SL, int E);

// OPS §5.4. max_draft_tokens is K (>= 0); block_size >= 1.
int speculate_schedule_cache(kl3::Context* ctx,
                             const int64_t* draft_tokens,       // [B, T]
                             const int32_t* block_tables,       // [B, NB]
                             bool* stop_flags,                  // [B]
                             const int64_t* prompt_lens,        // [B]
                             int32_t* seq_lens_this_time,       // [R]
                             int32_t* seq_lens_encoder,         // [B]
                             int32_t* seq_lens_decoder,         // [B]
                             int32_t* step_seq_lens_decoder,    // [B]
                             int64_t* step_draft_tokens,        // [B, T]
                             int32_t* step_seq_lens_this_time,  // [B]
                             int32_t* accept_num,               // [B]
                             int64_t* accept_tokens,            // [B, T]
                             bool* is_block_step,               // [B]
                             bool* not_need_stop,               // [1] host
                             int B, int R, int T, int NB,
                             int block_size, int max_draft_tokens, bool prefill_one_step_stop);

// OPS §5.5. Speculative variant when draft_tokens, step_draft_tokens and step_seq_lens_this_time are all given;
// non-speculative when all three are null (then T is ignored). A partial set is INVALID_PARAM.
int recover_decode_task(kl3::Context* ctx,
                        bool* stop_flags,                        // [B]
                        int32_t* seq_lens_this_time,             // [R]
                        int32_t* seq_lens_encoder,               // [B]
                        int32_t* seq_lens_decoder,               // [B]
                        const int32_t* step_seq_lens_decoder,    // [B]
                        const int32_t* block_tables,             // [B, NB]
                        bool* is_block_step,                     // [B]
                        int64_t* draft_tokens,                   // [B, T] or null
                        const int64_t* step_draft_tokens,        // [B, T] or null
                        const int32_t* step_seq_lens_this_time,  // [B] or null
                        int B, int R, int NB, int T,
                        int block_size, int max_draft_tokens);

// OPS §5.6. B = numel(accept_num).
int speculate_clear_accept_nums(kl3::Context* ctx,
                                int32_t* accept_num,              // [B]
                                const int32_t* seq_lens_decoder,  // [B]
                                int B);

// Length of the message speculate_save_output produces: 0 when this rank sends nothing (OPS §5.7 rule 1),
// else 2 + bsz + bsz * T.
inline int64_t speculate_save_output_msg_numel(int bsz, int T, int rank_id, bool save_each_rank) {
  if (!save_each_rank && rank_id > 0) {
    return 0;
  }
  return 2 + static_cast<int64_t>(bsz) + static_cast<int64_t>(bsz) * T;
}

// OPS §5.7. `msg` (host, int64) has speculate_save_output_msg_numel(...) elements and may be null when that is
// 0. Host assembly on every backend: there is no kernel.
int speculate_save_output(kl3::Context* ctx,
                          const int64_t* accept_tokens,     // [bsz, T]
                          const int32_t* accept_num,        // [bsz]
                          const bool* not_need_stop,        // [1] host
                          const int32_t* seq_lens_decoder,  // [bsz]
                          const int64_t* prompt_lens,       // [bsz]
                          int32_t* preempted_idx,           // [bsz] host
                          int64_t* msg,                     // [2 + bsz + bsz * T] host
                          int bsz, int T,
                          int rank_id, bool save_each_rank, bool skip_prefill);

}  // namespace plugin
}  // namespace fd_xpu
