// Paddle signatures of the state ops: inputs in OPS.md order, outputs, attributes and the in-place map that declares
// every tensor the op modifies and no other (OPS §2.5). Defined once so that each op and its benchmark dispatch
// floor (fd_dispatch_floor_<op>, fd_dispatch_floor.cc) are registered with exactly the same signature. At the end,
// the kernel functions the registrations name, which python_calls.cc binds by the same names.
#pragma once

#include <vector>

#include "paddle/extension.h"

#define SPECULATE_UPDATE_SIGNATURE \
    .Inputs({"seq_lens_encoder", "seq_lens_decoder", "not_need_stop", "draft_tokens", "actual_draft_token_nums",    \
             "accept_tokens", "accept_num", "stop_flags", "seq_lens_this_time", "is_block_step", "mask_rollback"})  \
    .Outputs({"seq_lens_encoder_out", "seq_lens_decoder_out", "not_need_stop_out", "draft_tokens_out",              \
              "actual_draft_token_nums_out", "mask_rollback_out"})                                                  \
    .Attrs({"ncluster: int"})                                                                                       \
    .SetInplaceMap({{"seq_lens_encoder", "seq_lens_encoder_out"},                                                   \
                    {"seq_lens_decoder", "seq_lens_decoder_out"},                                                   \
                    {"not_need_stop", "not_need_stop_out"},                                                         \
                    {"draft_tokens", "draft_tokens_out"},                                                           \
                    {"actual_draft_token_nums", "actual_draft_token_nums_out"},                                     \
                    {"mask_rollback", "mask_rollback_out"}})

#define SPECULATE_SET_VALUE_BY_FLAGS_AND_IDX_SIGNATURE \
    .Inputs({"pre_ids_all", "accept_tokens", "accept_num", "stop_flags", "seq_lens_this_time", "seq_lens_encoder",  \
             "seq_lens_decoder", "step_idx"})                                                                       \
    .Outputs({"pre_ids_all_out", "accept_num_out", "seq_lens_decoder_out"})                                         \
    .Attrs({"ncluster: int"})                                                                                       \
    .SetInplaceMap({{"pre_ids_all", "pre_ids_all_out"},                                                             \
                    {"accept_num", "accept_num_out"},                                                               \
                    {"seq_lens_decoder", "seq_lens_decoder_out"}})

#define SPECULATE_SET_STOP_VALUE_MULTI_SEQS_SIGNATURE \
    .Inputs({"accept_tokens", "accept_num", "pre_ids", "step_idx", "stop_flags", "seq_lens", "stop_seqs",  \
             "stop_seqs_len", "end_ids", "min_tokens"})                                                    \
    .Outputs({"accept_tokens_out", "accept_num_out", "stop_flags_out"})                                    \
    .Attrs({"ncluster: int"})                                                                              \
    .SetInplaceMap({{"accept_tokens", "accept_tokens_out"},                                                \
                    {"accept_num", "accept_num_out"},                                                      \
                    {"stop_flags", "stop_flags_out"}})

#define SPECULATE_SCHEDULE_CACHE_SIGNATURE \
    .Inputs({"draft_tokens", "block_tables", "stop_flags", "prompt_lens", "seq_lens_this_time", "seq_lens_encoder",   \
             "seq_lens_decoder", "step_seq_lens_decoder", "step_draft_tokens", "step_seq_lens_this_time",             \
             "accept_num", "accept_tokens", "is_block_step", "not_need_stop"})                                        \
    .Outputs({"stop_flags_out", "seq_lens_this_time_out", "seq_lens_encoder_out", "seq_lens_decoder_out",             \
              "step_seq_lens_decoder_out", "step_draft_tokens_out", "step_seq_lens_this_time_out", "accept_num_out",  \
              "accept_tokens_out", "is_block_step_out", "not_need_stop_out"})                                         \
    .Attrs({"block_size: int", "max_draft_tokens: int", "prefill_one_step_stop: bool", "ncluster: int"})              \
    .SetInplaceMap({{"stop_flags", "stop_flags_out"},                                                                 \
                    {"seq_lens_this_time", "seq_lens_this_time_out"},                                                 \
                    {"seq_lens_encoder", "seq_lens_encoder_out"},                                                     \
                    {"seq_lens_decoder", "seq_lens_decoder_out"},                                                     \
                    {"step_seq_lens_decoder", "step_seq_lens_decoder_out"},                                           \
                    {"step_draft_tokens", "step_draft_tokens_out"},                                                   \
                    {"step_seq_lens_this_time", "step_seq_lens_this_time_out"},                                       \
                    {"accept_num", "accept_num_out"},                                                                 \
                    {"accept_tokens", "accept_tokens_out"},                                                           \
                    {"is_block_step", "is_block_step_out"},                                                           \
                    {"not_need_stop", "not_need_stop_out"}})

#define RECOVER_DECODE_TASK_SIGNATURE \
    .Inputs({"stop_flags", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder", "step_seq_lens_decoder",  \
             "block_tables", "is_block_step"})                                                                     \
    .Outputs({"stop_flags_out", "seq_lens_this_time_out", "seq_lens_encoder_out", "seq_lens_decoder_out",          \
              "is_block_step_out"})                                                                                \
    .Attrs({"block_size: int", "max_draft_tokens: int", "ncluster: int"})                                          \
    .SetInplaceMap({{"stop_flags", "stop_flags_out"},                                                              \
                    {"seq_lens_this_time", "seq_lens_this_time_out"},                                              \
                    {"seq_lens_encoder", "seq_lens_encoder_out"},                                                  \
                    {"seq_lens_decoder", "seq_lens_decoder_out"},                                                  \
                    {"is_block_step", "is_block_step_out"}})

#define RECOVER_SPEC_DECODE_TASK_SIGNATURE \
    .Inputs({"stop_flags", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder", "step_seq_lens_decoder",  \
             "block_tables", "is_block_step", "draft_tokens", "step_draft_tokens", "step_seq_lens_this_time"})     \
    .Outputs({"stop_flags_out", "seq_lens_this_time_out", "seq_lens_encoder_out", "seq_lens_decoder_out",          \
              "is_block_step_out", "draft_tokens_out"})                                                            \
    .Attrs({"block_size: int", "max_draft_tokens: int", "ncluster: int"})                                          \
    .SetInplaceMap({{"stop_flags", "stop_flags_out"},                                                              \
                    {"seq_lens_this_time", "seq_lens_this_time_out"},                                              \
                    {"seq_lens_encoder", "seq_lens_encoder_out"},                                                  \
                    {"seq_lens_decoder", "seq_lens_decoder_out"},                                                  \
                    {"is_block_step", "is_block_step_out"},                                                        \
                    {"draft_tokens", "draft_tokens_out"}})

#define SPECULATE_CLEAR_ACCEPT_NUMS_SIGNATURE \
    .Inputs({"accept_num", "seq_lens_decoder"})         \
    .Outputs({"accept_num_out"})                        \
    .Attrs({"ncluster: int"})                           \
    .SetInplaceMap({{"accept_num", "accept_num_out"}})

#define SPECULATE_SAVE_OUTPUT_SIGNATURE \
    .Inputs({"accept_tokens", "accept_num", "not_need_stop", "seq_lens_decoder", "prompt_lens", "preempted_idx"})  \
    .Outputs({"msg", "preempted_idx_out"})                                                                         \
    .Attrs({"rank_id: int", "save_each_rank: bool", "skip_prefill: bool", "ncluster: int"})                        \
    .SetInplaceMap({{"preempted_idx", "preempted_idx_out"}})

// The kernel functions, in the registrations' argument order (each defined in its own ops/mtp/*.cc).
using PdT = paddle::Tensor;
void SpeculateUpdate(PdT&, PdT&, PdT&, PdT&, PdT&, const PdT&, const PdT&, const PdT&, const PdT&, const PdT&, PdT&,
                     int ncluster);
void SpeculateSetValueByFlagsAndIdx(PdT&, const PdT&, PdT&, const PdT&, const PdT&, const PdT&, PdT&, const PdT&,
                                    int ncluster);
void SpeculateSetStopValueMultiSeqs(PdT&, PdT&, const PdT&, const PdT&, PdT&, const PdT&, const PdT&, const PdT&,
                                    const PdT&, const PdT&, int ncluster);
void SpeculateScheduleCache(const PdT&, const PdT&, PdT&, const PdT&, PdT&, PdT&, PdT&, PdT&, PdT&, PdT&, PdT&, PdT&,
                            PdT&, PdT&, int block_size, int max_draft_tokens, bool prefill_one_step_stop,
                            int ncluster);
void RecoverDecodeTask(PdT&, PdT&, PdT&, PdT&, const PdT&, const PdT&, PdT&, int block_size, int max_draft_tokens,
                       int ncluster);
void RecoverSpecDecodeTask(PdT&, PdT&, PdT&, PdT&, const PdT&, const PdT&, PdT&, PdT&, const PdT&, const PdT&,
                           int block_size, int max_draft_tokens, int ncluster);
void SpeculateClearAcceptNums(PdT&, const PdT&, int ncluster);
std::vector<PdT> SpeculateSaveOutput(const PdT&, const PdT&, const PdT&, const PdT&, const PdT&, PdT&, int rank_id,
                                     bool save_each_rank, bool skip_prefill, int ncluster);

// The dispatch floors' (fd_dispatch_floor.cc): the same arguments, nothing done.
namespace fd_floor {
void DispatchFloor(PdT&, int);
void Update(PdT&, PdT&, PdT&, PdT&, PdT&, const PdT&, const PdT&, const PdT&, const PdT&, const PdT&, PdT&, int);
void SetValue(PdT&, const PdT&, PdT&, const PdT&, const PdT&, const PdT&, PdT&, const PdT&, int);
void SetStop(PdT&, PdT&, const PdT&, const PdT&, PdT&, const PdT&, const PdT&, const PdT&, const PdT&, const PdT&, int);
void Schedule(const PdT&, const PdT&, PdT&, const PdT&, PdT&, PdT&, PdT&, PdT&, PdT&, PdT&, PdT&, PdT&, PdT&, PdT&,
              int, int, bool, int);
void Recover(PdT&, PdT&, PdT&, PdT&, const PdT&, const PdT&, PdT&, int, int, int);
void RecoverSpec(PdT&, PdT&, PdT&, PdT&, const PdT&, const PdT&, PdT&, PdT&, const PdT&, const PdT&, int, int, int);
void Clear(PdT&, const PdT&, int);
std::vector<PdT> Save(const PdT&, const PdT&, const PdT&, const PdT&, const PdT&, PdT&, int, bool, bool, int);
}  // namespace fd_floor
